/* A loop the compiler should vectorise whatever the build's optimisation level. */
#ifndef ZB_UTIL_VECLOOP_H
#define ZB_UTIL_VECLOOP_H

/* An AVX2 clone where the CPU has it, chosen at load time, beside the baseline one; -O2 leaves
 * min/max reductions and widening conversions scalar, hence O3 for the loops marked so. Not
 * under ThreadSanitizer: the clone's resolver (an ifunc) runs while the dynamic loader relocates
 * the program, before TSan's runtime exists, and its instrumented code crashes there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define ZB_VECTOR_LOOP __attribute__((target_clones("avx2", "default"), optimize("O3")))
#else
#define ZB_VECTOR_LOOP
#endif

#endif
