/* The synthetic generators' PRNG: splitmix64 expands a 64-bit seed into xoshiro256** state
 * (the pairing their authors recommend). Hand-written because synthetic stores must be the same
 * bytes on every platform and C library; rand() is neither portable nor good enough. */
#ifndef ZB_CLI_PRNG_H
#define ZB_CLI_PRNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

static inline uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static inline uint64_t
rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

#endif
