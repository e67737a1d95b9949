/* Internals shared by the atomistic layout writer (atomistic.c) and its store operations
 * (atomistic_ops.c: delete, defragment, add_custom, check, recover). Format facts: shared
 * FORMATS.md §8. "Atomistic" names the layout (nvalchemi AtomicData: atoms, edges, systems)
 * inside the library; the public API keeps the layout's user-facing name, "atomic"
 * (zb_atomic_*, zbatch.AtomicWriter). Writing crash-safely is "committing" (zb_*_commit). */
#ifndef ZB_WRITE_ATOMISTIC_INT_H
#define ZB_WRITE_ATOMISTIC_INT_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zbatch.h"

#define ZB_AT_PATH_CAP 4096
#define ZB_AT_KEY_CAP (ZB_AT_PATH_CAP + 512)
#define ZB_AT_NAME_CAP 256

/* The five arrays of meta/, in the order the layout lists them. */
enum {
    ZB_AT_ATOMS_PTR,
    ZB_AT_EDGES_PTR,
    ZB_AT_SAMPLES_MASK,
    ZB_AT_ATOMS_MASK,
    ZB_AT_EDGES_MASK,
    ZB_AT_NMETA
};
extern const char *const zb__at_meta_names[ZB_AT_NMETA];

/* A config deep-copied out of the caller's (strings owned). */
typedef struct zb__at_cfg {
    zb_atomic_array_config group[3]; /* meta, core, custom */
    zb_atomic_override *ov;
    size_t n_ov;
    int num_threads;
} zb__at_cfg;

/* Copies `src` (NULL = the defaults) into *dst and validates every codec string and
 * shard/chunk pair. */
zb_status zb__at_cfg_copy(const zb_atomic_write_config *src, zb__at_cfg *dst);
void zb__at_cfg_free(zb__at_cfg *cfg);
/* Appends an override (copied). */
zb_status zb__at_cfg_add_override(zb__at_cfg *cfg, const char *name,
                                  const zb_atomic_array_config *c);
/* Resolves the storage of array `group`/`name`, whose rows are `row_bytes` bytes, into
 * array-writer options (codec points into cfg). */
void zb__at_cfg_resolve(const zb__at_cfg *cfg, const char *group, const char *name,
                        size_t row_bytes, zb_array_write_opts *opts);

/* One data array (core/ or custom/) of an existing dataset. */
typedef struct zb__at_array {
    char group[8]; /* "core" or "custom" */
    char name[ZB_AT_NAME_CAP];
    zb_atomic_level level;
    zb_array *a;
    zb_array_info info;
} zb__at_array;

/* An existing dataset, opened. */
typedef struct zb__at_layout {
    char path[ZB_AT_PATH_CAP]; /* normalised */
    json_object *attrs;        /* the root group's attributes (owned) */
    uint64_t num_samples;
    zb_array *meta[ZB_AT_NMETA]; /* the masks of atoms/edges may be NULL (absent) */
    uint64_t meta_rows[ZB_AT_NMETA];
    size_t n;
    zb__at_array *arrays; /* core/ sorted by name, then custom/ sorted by name */
} zb__at_layout;

/* Opens the dataset at `path`: the root zarr.json (v3 group) with num_samples, the meta arrays
 * (atoms_ptr, edges_ptr and samples_mask required) and every array of core/ and custom/ with
 * its level. Checks nothing about lengths. ZB_E_INCOMPLETE for a marker without a root
 * document, ZB_E_NOTFOUND when there is no root document. */
zb_status zb__at_layout_open(zb_store *store, const char *path, zb__at_layout *L);
void zb__at_layout_close(zb__at_layout *L);

/* The level of `group`/`name` by the `fields` attribute (may be NULL), then nvalchemi's key
 * sets (core) or "system" (custom), as nvalchemi's reader decides it. */
zb_atomic_level zb__at_level_of(json_object *fields, const char *group, const char *name);

/* Reads rows [start, stop) of a 1-d integer array as int64 (any integer dtype). */
zb_status zb__at_read_i64(const zb_array *a, uint64_t start, uint64_t stop, int64_t *dst);

/* "path/a" or "a" when path is "". */
zb_status zb__at_join(char *buf, size_t cap, const char *path, const char *name);
/* "path/a/b". */
zb_status zb__at_join3(char *buf, size_t cap, const char *path, const char *a, const char *b);

/* True if `key` names an object. */
bool zb__at_has_key(zb_store *store, const char *key);
/* True if any object lives below `prefix`. */
bool zb__at_has_keys_below(zb_store *store, const char *prefix);
/* True if `path` holds a committed dataset root: zarr.json present, marker absent. */
bool zb__at_is_complete(zb_store *store, const char *path);

/* Erases every object below `prefix` (the root zarr.json first, so a half-removed store never
 * passes for a complete one), then tries to erase the emptied directories. */
zb_status zb__at_remove_tree(zb_store *store, const char *prefix);
/* Moves everything below `from` to `to`: one rename where the backend renames prefixes (file),
 * else key by key. ZB_E_NOTFOUND if nothing lives below `from`. */
zb_status zb__at_rename_tree(zb_store *store, const char *from, const char *to);

/* True if `path` holds nothing but a complete dataset sits under one of its defragment names
 * (`<path>.zbatch-new`, `<path>.zbatch-old*`): a crash in the middle of a swap, which
 * zb_atomic_recover resolves. */
bool zb__at_parked_elsewhere(zb_store *store, const char *path);

/* Writes the root group document of `path` with `attrs`. */
zb_status zb__at_write_root(zb_store *store, const char *path, json_object *attrs);

/* Sets attrs["fields"][group][name] = level (creating the objects). */
zb_status zb__at_fields_set(json_object *attrs, const char *group, const char *name,
                            zb_atomic_level level);

/* Rewrites shape[0] of the array's metadata document to `rows` (the cut-back of an uncommitted
 * tail). */
zb_status zb__at_truncate_array(zb_store *store, const char *array_path, uint64_t rows);

/* Internal constructor: a new dataset whose root keeps the attributes of `base_attrs` (may be
 * NULL; num_samples and fields are rewritten). */
zb_status zb__at_writer_open_new(zb_store *store, const char *path, const zb__at_cfg *cfg,
                                 json_object *base_attrs, zb_atomic_writer **out);

/* The first of `elems` values of `dtype` at `data` that is NaN or infinite; `elems` if none (and
 * always for non-float types). */
uint64_t zb__at_first_non_finite(zb_dtype dtype, const void *data, uint64_t elems);

/* Marks the writer as copying rows already stored (defragment): they are kept as they are, so
 * the finiteness check of new values (zb_atomic_writer_add) is skipped; a store nvalchemi wrote
 * with a NaN label stays defragmentable. */
void zb__at_writer_set_copying(zb_atomic_writer *w);

/* Validates an array/field name: non-empty, below ZB_AT_NAME_CAP, no '/', no leading '.' or "__".
 */
zb_status zb__at_check_name(const char *what, const char *name);

/* Sample-level element access for integer dtypes (neighbor_list conversions). */
int64_t zb__at_get_int(const void *base, zb_dtype dt, uint64_t i);
/* Stores v; false if it does not fit the dtype. */
bool zb__at_set_int(void *base, zb_dtype dt, uint64_t i, int64_t v);
bool zb__at_dtype_is_int(zb_dtype dt);

#endif
