/* zbatch_neighbors.h — part of the public C API (included by zbatch.h): neighbour lists of
 * atomic structures from a cutoff. Conventions, status codes and thread-safety rules are those
 * of zbatch.h. */
#ifndef ZBATCH_NEIGHBORS_H
#define ZBATCH_NEIGHBORS_H

#include "zbatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Neighbour lists.
 *
 * For one structure (n atoms at positions r, a cell whose ROWS are the lattice vectors a, b, c,
 * periodicity per axis) and a cutoff, the list holds every ordered triple (i, j, S), S an
 * integer cell-shift vector, with
 *
 *       | r_j − r_i + S·cell | < cutoff        (S·cell = S0·a + S1·b + S2·c; strict "<")
 *
 * except i == j with S == 0. This is the set ase.neighborlist.neighbor_list("ijS", atoms,
 * cutoff) returns (checked against ASE 3.29, self_interaction=False), with its conventions:
 * - both directions: (i, j, S) and (j, i, −S) are both listed;
 * - an atom meets its own periodic images (i == j, S != 0), so a one-atom cell has neighbours;
 * - when the cutoff exceeds the cell, an atom j appears once per image S within the cutoff;
 * - S is 0 along every non-periodic axis; a non-periodic axis's lattice vector is not used at
 *   all, so it may be zero (a molecule may have the zero cell, a slab a zero c vector);
 * - atoms need not lie inside the cell: S is relative to the positions as given, exactly as in
 *   ASE (the distance is computed the way ASE computes it, (r_j − r_i) + S·cell, so even a pair
 *   at a hair from the cutoff is decided as ASE decides it barring rounding differences of one
 *   unit in the last place).
 * Pairs are grouped by i in increasing order; the order of the pairs of one i is unspecified
 * but deterministic. ASE's i, j and S are (its "ijS"); nvalchemi's AtomicData calls S
 * `neighbor_list_shifts` and the Cartesian vector S·cell `shifts`, with neighbor_list[e] =
 * (i, j) (source, target).
 *
 * The work is O(n + pairs): atoms are sorted into bins of the cell's own (fractional) axes, at
 * least half a cutoff thick and never more than 2n + 8 of them, and each atom looks only at
 * the bins within a cutoff of it (when the cutoff exceeds the cell, a bin is visited once per
 * periodic image). Scratch memory is about 130 bytes per atom, besides the output (40 bytes
 * per pair).
 * ------------------------------------------------------------------------------------------- */

/* One structure. Borrowed: the library reads it during the call only. */
typedef struct zb_structure {
    uint64_t n_atoms;
    const double *positions; /* [n_atoms][3] Cartesian coordinates (e.g. Å), C order; NULL
                                only when n_atoms is 0 */
    const double *cell;      /* [3][3] C order, row k = lattice vector k; NULL = the zero cell
                                (allowed only when no axis is periodic) */
    bool pbc[3];             /* periodicity along each lattice vector */
} zb_structure;

/* A neighbour list. The library allocates the arrays and grows them on later builds into the
 * same list (so a loop over structures reuses one allocation); zb_neighbor_list_free releases
 * them. Start from ZB_NEIGHBOR_LIST_INIT (all zero). */
typedef struct zb_neighbor_list {
    uint64_t n_pairs;
    int64_t *i;           /* [n_pairs] first atom ("centre", nvalchemi's source) */
    int64_t *j;           /* [n_pairs] second atom (the neighbour, nvalchemi's target) */
    int64_t *cell_shifts; /* [n_pairs][3] the integer shift S of each pair */
    uint64_t capacity;    /* pairs the arrays can hold; managed by the library */
} zb_neighbor_list;

#define ZB_NEIGHBOR_LIST_INIT                                                                      \
    {                                                                                              \
        0, NULL, NULL, NULL, 0                                                                     \
    }

/* Builds the neighbour list of `s` for `cutoff` into `nl` (replacing what it held; its arrays
 * are reused and grown as needed). `max_pairs` caps the output (0 = no cap): a structure with
 * more pairs fails with ZB_E_OVERFLOW instead of allocating without bound (a 1 Å cell with a
 * 100 Å cutoff has four million pairs per atom).
 * Thread-safety: a pure function of its arguments; threads may build at once into distinct
 * lists.
 * Errors (on failure nl->n_pairs is 0 and nl keeps its arrays; free it as usual):
 * - ZB_E_INVALID: a NULL argument, a cutoff that is not finite or not > 0, a position that is
 *   not finite (the message names the atom), a cell with a non-finite entry, a singular
 *   periodic cell (a periodic lattice vector that is zero or lies in the span of the other
 *   periodic ones), an atom further than 2^40 cells outside a periodic cell, a NULL cell with a
 *   periodic axis;
 * - ZB_E_OVERFLOW: more than max_pairs pairs, or a cutoff that spans more than 65,536 lattice
 *   planes along an axis;
 * - ZB_E_NOMEM. */
ZB_API zb_status zb_neighbor_list_build(const zb_structure *s, double cutoff, uint64_t max_pairs,
                                        zb_neighbor_list *nl);

/* Frees the arrays of `nl` and resets it to ZB_NEIGHBOR_LIST_INIT (it may be built into
 * again). NULL is a no-op. */
ZB_API void zb_neighbor_list_free(zb_neighbor_list *nl);

#ifdef __cplusplus
}
#endif
#endif
