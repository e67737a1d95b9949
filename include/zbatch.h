/*
 * zbatch.h — the public C API of libzbatch, and its manual.
 *
 * zbatch reads Zarr v2 and v3 stores (sharding included) with every common codec and feeds
 * training loops from them. This header is the contract: every exported function is declared
 * and documented here, with its ownership rules, thread-safety and errors.
 *
 * Conventions
 * -----------
 * - Every fallible function returns a zb_status: ZB_OK (0) on success, a negative code on
 *   failure. Results come back through out-parameters; on failure an out-handle is set to NULL
 *   and nothing leaks.
 * - Every *_close / *_free accepts NULL and then does nothing.
 * - A failing call records a detail message (naming the key, codec and byte offset of what went
 *   wrong) for the calling thread; zb_last_error() returns it. The message is per thread, not
 *   per handle, because the handles that fail most (arrays, stores) are shared by threads.
 * - Sizes are size_t / uint64_t; counts of elements are uint64_t.
 *
 * Thread-safety
 * -------------
 * - A zb_store may be shared by threads: every backend's get/size/list is thread-safe.
 * - A zb_array is immutable after open and may be shared by threads.
 * - A zb_ctx (codec contexts and scratch buffers) is used by one thread at a time.
 *
 * Caveats
 * -------
 * - The library reads no environment variables; the CLI and the Python package may, and pass
 *   options down.
 * - Handles must not be used across fork() in the child.
 */
#ifndef ZBATCH_H
#define ZBATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks what libzbatch exports. The library is built with -fvisibility=hidden, so a function
 * this header (or one it includes) declares with ZB_API is the whole of its ABI; everything
 * else in the library is internal, named zb__*, and invisible to the dynamic linker. */
#if defined(__GNUC__) || defined(__clang__)
#define ZB_API __attribute__((visibility("default")))
#else
#define ZB_API
#endif

/* The project's one version: CMakeLists.txt and pyproject.toml read these three lines, the
 * command's --version and zbatch.__version__ print ZB_VERSION_STRING. */
#define ZB_VERSION_MAJOR 0
#define ZB_VERSION_MINOR 1
#define ZB_VERSION_PATCH 0
#define ZB_VERSION_STR_(x) #x
#define ZB_VERSION_XSTR_(x) ZB_VERSION_STR_(x)
#define ZB_VERSION_STRING                                                                          \
    ZB_VERSION_XSTR_(ZB_VERSION_MAJOR)                                                             \
    "." ZB_VERSION_XSTR_(ZB_VERSION_MINOR) "." ZB_VERSION_XSTR_(ZB_VERSION_PATCH)

/* ---------------------------------------------------------------------------------------------
 * Status codes. One X-macro list produces the enum and zb_strerror. Codes are only ever added;
 * a retired code keeps its number as a placeholder.
 * ------------------------------------------------------------------------------------------- */
#define ZB_STATUS_LIST(X)                                                                          \
    X(ZB_OK, 0, "success")                                                                         \
    X(ZB_E_INVALID, -1, "invalid argument")                                                        \
    X(ZB_E_NOMEM, -2, "out of memory")                                                             \
    X(ZB_E_IO, -3, "I/O error")                                                                    \
    X(ZB_E_NOTFOUND, -4, "key not found")                                                          \
    X(ZB_E_BADKEY, -5, "key is malformed or escapes the store root")                               \
    X(ZB_E_JSON, -6, "malformed JSON")                                                             \
    X(ZB_E_METADATA, -7, "invalid Zarr metadata")                                                  \
    X(ZB_E_UNSUPPORTED, -8, "unsupported feature")                                                 \
    X(ZB_E_OVERFLOW, -9, "size or element count overflows")                                        \
    X(ZB_E_CORRUPT, -10, "corrupt data")                                                           \
    X(ZB_E_TRUNCATED, -11, "data is truncated")                                                    \
    X(ZB_E_CHECKSUM, -12, "checksum mismatch")                                                     \
    X(ZB_E_SHARD_RANGE, -13, "shard index entry out of range")                                     \
    X(ZB_E_RANGE, -14, "index out of range")                                                       \
    X(ZB_E_TYPE, -15, "wrong data type for this operation")                                        \
    X(ZB_E_INCOMPLETE, -16, "store is incomplete (a write was not committed)")                     \
    X(ZB_E_CANCELLED, -17, "cancelled by the caller")                                              \
    X(ZB_E_DENIED, -18, "access denied (check the credentials)")

typedef enum zb_status {
#define ZB_STATUS_ENUM_(name, value, text) name = value,
    ZB_STATUS_LIST(ZB_STATUS_ENUM_)
#undef ZB_STATUS_ENUM_
} zb_status;

/* A static description of a status code; never NULL (unknown codes give "unknown status"). */
ZB_API const char *zb_strerror(zb_status status);

/* The symbolic name of a status code ("ZB_E_CORRUPT"); never NULL. */
ZB_API const char *zb_status_name(zb_status status);

/* The detail message of the last failing call on this thread ("" if none), well-formed UTF-8
 * (bytes of a quoted name that are not UTF-8 appear as \xNN). The pointer stays valid until the
 * next zbatch call on this thread. */
ZB_API const char *zb_last_error(void);

/* Clears this thread's detail message. */
ZB_API void zb_clear_error(void);

/* ---------------------------------------------------------------------------------------------
 * Stores: bytes under keys.
 *
 * A store is a methods table plus the backend's state. Keys are '/'-separated paths relative to
 * the store root; zb_store_* normalise them ('\' to '/', leading, trailing and repeated '/'
 * dropped) and refuse "." and ".." segments with ZB_E_BADKEY before any backend sees them.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_store zb_store;

/* Called once per child name by list(); return non-zero to stop early. `name` lives for the
 * duration of the call. */
typedef int (*zb_list_fn)(void *ctx, const char *name, bool is_dir);

typedef struct zb_store_stats zb_store_stats; /* counters of a store, below */

/* One byte range of a list read (zb_store_get_ranges). */
typedef struct zb_range {
    const char *key;  /* in: the object */
    uint64_t offset;  /* in: first byte, or ZB_RANGE_SUFFIX; out: where a suffix began */
    uint64_t length;  /* in: bytes wanted */
    void *dst;        /* in: where they go (length bytes) */
    uint64_t nread;   /* out: bytes read (short only at the end of the object) */
    zb_status status; /* out: ZB_OK, ZB_E_NOTFOUND for a missing key, ... */
} zb_range;

/* A range's offset asking for the last `length` bytes of its object (all of it when shorter;
 * one HTTP request "bytes=-LENGTH", no size query first): on completion offset holds where those
 * bytes began, so offset + nread is the object's size. */
#define ZB_RANGE_SUFFIX UINT64_MAX

/* Called once per completed range of a list read; return non-zero to cancel the rest. */
typedef int (*zb_range_fn)(void *ctx, size_t i);

/* The methods a backend implements. `self` is the backend's state. get/size/list must be
 * thread-safe. put/erase/rename may be NULL for read-only backends (ZB_E_UNSUPPORTED). */
typedef struct zb_store_methods {
    const char *scheme; /* "file", "memory", ... */
    /* Reads up to `length` bytes at `offset` of `key` into dst; *nread is what was read (short
     * only at the end of the object). A missing key is ZB_E_NOTFOUND. */
    zb_status (*get)(void *self, const char *key, uint64_t offset, uint64_t length, void *dst,
                     uint64_t *nread);
    /* The size of `key` in bytes; ZB_E_NOTFOUND if absent. */
    zb_status (*size)(void *self, const char *key, uint64_t *size);
    /* Lists the immediate children of `prefix` ("" is the root), in no particular order. */
    zb_status (*list)(void *self, const char *prefix, zb_list_fn fn, void *ctx);
    zb_status (*put)(void *self, const char *key, const void *data, uint64_t length);
    zb_status (*erase)(void *self, const char *key);
    zb_status (*rename)(void *self, const char *from, const char *to);
    void (*close)(void *self);
    /* Optional (NULL: none): a read-only view of up to `length` bytes at `offset` of `key`,
     * without copying them. *data points at the bytes, *nread says how many (short only at the
     * end of the object), and the view stays valid until release(self, *token). A backend may
     * decline any key with ZB_E_UNSUPPORTED; callers then read with get. */
    zb_status (*view)(void *self, const char *key, uint64_t offset, uint64_t length,
                      const uint8_t **data, uint64_t *nread, void **token);
    void (*release)(void *self, void *token);
    /* Optional (NULL: the store layer calls get once per range, in order): reads a whole list
     * of byte ranges, which a remote backend issues concurrently. Each range's key is already
     * normalised. The call fills every range's nread and status, and calls done(ctx, i) on the
     * calling thread as range i completes (in completion order, success or not; on failure the
     * thread's error message, zb_last_error, describes range i during the call). done returning
     * non-zero cancels the ranges not yet complete (status ZB_E_CANCELLED). Returns ZB_OK when
     * every range was attempted or cancelled, even if some failed. */
    zb_status (*get_ranges)(void *self, zb_range *ranges, size_t n, zb_range_fn done, void *ctx);
    /* Optional (NULL: zeros): the backend's counters (zb_store_get_stats). */
    void (*stats)(void *self, zb_store_stats *out);
    /* get_ranges reads suffix ranges (ZB_RANGE_SUFFIX) itself, setting their offsets; false: a
     * list holding one is read by the store layer, one size and get per range, in order. */
    bool suffix_ranges;
} zb_store_methods;

/* Wraps a custom backend. On success the store owns `self` and calls methods->close(self) when
 * it closes; on failure `self` is left to the caller. */
ZB_API zb_status zb_store_new(const zb_store_methods *methods, void *self, zb_store **out);

/* Options of remote stores (docs/REMOTE.md). The library reads no environment variable: the CLI
 * and the Python package fill these from AWS_* variables and storage_options. Strings are
 * copied at open. */
typedef struct zb_remote_opts {
    /* S3 credentials; NULL access_key_id (or anonymous) sends unsigned requests. */
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token;  /* sent as X-Amz-Security-Token, NULL = none */
    const char *region;         /* NULL = "us-east-1" */
    const char *endpoint_url;   /* S3 endpoint ("http://127.0.0.1:9000"); NULL = AWS */
    bool anonymous;             /* never sign, even when keys are given */
    int addressing;             /* ZB_S3_ADDRESSING_*: where the bucket goes in the URL */
    int max_in_flight;          /* requests in flight per get_ranges call; 0 = 256 */
    uint64_t coalesce_gap;      /* ranges of one object at most this many bytes apart are read
                                   by one request; default 64 KiB */
    uint64_t max_request_bytes; /* a coalesced request spans at most this; default 16 MiB */
    int max_retries;            /* retries of one request (the retry budget); default 10 */
    double backoff_base_s;      /* first retry waits up to this (full jitter); default 0.05 */
    double backoff_max_s;       /* no wait exceeds this; default 5 */
    double connect_timeout_s;   /* default 10 */
    double stall_timeout_s;     /* a transfer without a byte for this long is retried; default 30 */
    uint64_t multipart_threshold; /* S3 puts above this size use multipart upload; default 64 MiB */
    uint64_t part_bytes;          /* multipart part size (>= 5 MiB on AWS); default 16 MiB */
    bool insecure;                /* https: skip certificate verification (tests only) */
} zb_remote_opts;

enum {
    ZB_S3_ADDRESSING_AUTO = 0,   /* path-style with an endpoint_url, else virtual-hosted */
    ZB_S3_ADDRESSING_PATH = 1,   /* ENDPOINT/bucket/key */
    ZB_S3_ADDRESSING_VIRTUAL = 2 /* bucket.ENDPOINT-HOST/key */
};

#define ZB_REMOTE_OPTS_DEFAULT                                                                     \
    {                                                                                              \
        NULL, NULL, NULL, NULL, NULL, false, ZB_S3_ADDRESSING_AUTO, 256, (uint64_t)64 << 10,       \
            (uint64_t)16 << 20, 10, 0.05, 5.0, 10.0, 30.0, (uint64_t)64 << 20, (uint64_t)16 << 20, \
            false                                                                                  \
    }

/* What one profile of the AWS shared files says (~/.aws/credentials and ~/.aws/config, the INI
 * files the AWS CLI writes). Members are malloc'd (NULL: not given); free with
 * zb_aws_profile_free. */
typedef struct zb_aws_profile {
    char *access_key_id, *secret_access_key, *session_token;
    char *region;       /* the config file's `region` */
    char *endpoint_url; /* the config file's `endpoint_url` */
    bool found;         /* a section for the profile exists in either file */
} zb_aws_profile;

/* Reads profile `profile` (NULL = "default") from the credentials file (sections [NAME]) and
 * the config file (sections [profile NAME], or [default]); either path may be NULL or name a
 * file that does not exist. Credentials come from the credentials file first, then from the
 * config file; region and endpoint_url from the config file. The caller (the command, the
 * Python package) finds the paths (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, ~/.aws/) and
 * decides what a missing profile means (out->found false). Comments (# ;), blank lines and
 * indented nested settings (`s3 =` blocks) are skipped.
 * Errors: ZB_E_INVALID naming the file and line for a line that is neither a section, a
 * setting nor a comment, a setting before any section, or the profile's section twice in one
 * file; ZB_E_IO for a file that exists but cannot be read. Messages never hold a value read
 * from the files. On failure *out holds nothing. Thread-safe. */
ZB_API zb_status zb_aws_profile_load(const char *credentials_path, const char *config_path,
                                     const char *profile, zb_aws_profile *out);
ZB_API void zb_aws_profile_free(zb_aws_profile *p);

/* Options of a store opened by URL or path. Start from ZB_STORE_OPTS_DEFAULT. */
typedef struct zb_store_opts {
    /* The file backend's mapping budget: how many bytes of data files one store may keep
     * memory-mapped for zb_store_view (ZB_STORE_DEFAULT_MMAP_BYTES, 1 GiB); beyond it views are
     * declined and readers use pread; 0 turns views off. Other backends ignore it. The CLI and
     * the Python package fill it from the environment variable ZBATCH_MMAP_BYTES. */
    uint64_t mmap_bytes;
    /* The file backend: follow symbolic links that lead out of the root (a store that is a farm
     * of links into other directories); what they lead to must still be a regular file.
     * Default false: such a key is ZB_E_BADKEY. */
    bool allow_links_outside;
    /* Remote stores (http, https, s3): NULL = ZB_REMOTE_OPTS_DEFAULT (anonymous S3). */
    const zb_remote_opts *remote;
    /* The file backend: bypass the page cache (O_DIRECT) for objects of at least
     * ZB_STORE_DIRECT_MIN_BYTES (64 KiB). zb_store_put writes their 4096-byte blocks directly
     * (from the caller's buffer when it is 4096-aligned, else through a bounce buffer the store
     * keeps for reuse; the last partial block is written buffered), and zb_store_get reads
     * directly when its offset, length and buffer are all 4096-aligned (a short read at the end
     * of the file is fine). For output written once and read back at most once, such as a
     * conversion's (zbatch convert uses it): copying it through the page cache costs CPU time,
     * writeback work and the cache the user had. Where the file system refuses O_DIRECT (at open
     * or at the first write), the store falls back to buffered I/O for its life, silently and
     * with the same bytes. Leave it false for stores that are read repeatedly. Default false;
     * other backends ignore it. */
    bool direct_io;
} zb_store_opts;

#define ZB_STORE_DEFAULT_MMAP_BYTES ((uint64_t)1 << 30)
#define ZB_STORE_DIRECT_MIN_BYTES ((uint64_t)64 << 10)
/* Direct reads need their offset, length and buffer aligned to this (zb_store_opts.direct_io). */
#define ZB_STORE_DIRECT_ALIGN ((size_t)4096)
#define ZB_STORE_OPTS_DEFAULT                                                                      \
    {                                                                                              \
        ZB_STORE_DEFAULT_MMAP_BYTES, false, NULL, false                                            \
    }

/* Opens a store by URL: a file path or file:// URL (a directory), memory://, or a remote store
 * (http://, https://, s3://bucket/prefix). The options are ZB_STORE_OPTS_DEFAULT. */
ZB_API zb_status zb_store_open(const char *url, zb_store **out);

/* zb_store_open with options (NULL: ZB_STORE_OPTS_DEFAULT). A remote store is thread-safe like
 * every store; its get_ranges issues up to max_in_flight requests at once over reused connections, coalescing nearby ranges of one
 * object, retrying 5xx, 429, timeouts, resets and short or over-long bodies with exponential
 * backoff and full jitter. A final error names the URL, the byte range and the last HTTP status,
 * never a credential. A 404 is ZB_E_NOTFOUND; a 401/403 is ZB_E_DENIED. http(s) stores cannot
 * list (open stores with consolidated metadata) and are read-only. */
ZB_API zb_status zb_store_open_opts(const char *url, const zb_store_opts *opts, zb_store **out);

/* A store over a directory. Reads use pread on a fresh descriptor per call (thread-safe).
 * Only regular files are data: a FIFO, socket or device at a key is ZB_E_CORRUPT naming the key
 * (never a hang, never a missing chunk); a directory at a key is ZB_E_NOTFOUND. A key whose path
 * leaves the root through a symbolic link (`sub -> /elsewhere`, `chunk -> /dev/zero`) is
 * ZB_E_BADKEY, for reads and writes alike, unless zb_store_opts.allow_links_outside. The
 * options are ZB_STORE_OPTS_DEFAULT. */
ZB_API zb_status zb_store_open_file(const char *root, zb_store **out);

/* zb_store_open_file with options (NULL: ZB_STORE_OPTS_DEFAULT). */
ZB_API zb_status zb_store_open_file_opts(const char *root, const zb_store_opts *opts,
                                         zb_store **out);

/* Counters of a store since it opened (remote backends count; others report zeros). */
struct zb_store_stats {
    uint64_t requests;      /* HTTP requests completed (each attempt counts) */
    uint64_t retries;       /* attempts beyond the first */
    uint64_t ranges;        /* ranges asked for through get/get_ranges */
    uint64_t bytes;         /* body bytes received */
    uint64_t max_in_flight; /* the most requests in flight at once (all threads and calls) */
};

/* Fills *stats (zeros for backends that keep none). Thread-safe. */
ZB_API void zb_store_get_stats(const zb_store *store, zb_store_stats *stats);

/* An empty in-memory store (thread-safe: a mutex guards the key table). */
ZB_API zb_status zb_store_open_memory(zb_store **out);

ZB_API void zb_store_close(zb_store *store);

/* The backend's scheme ("file", "memory"). */
ZB_API const char *zb_store_scheme(const zb_store *store);

/* The store's name in messages: the directory given to zb_store_open / zb_store_open_file,
 * else "SCHEME://" (a memory store, a custom backend). Lives as long as the store. */
ZB_API const char *zb_store_name(const zb_store *store);

ZB_API zb_status zb_store_get(zb_store *store, const char *key, uint64_t offset, uint64_t length,
                              void *dst, uint64_t *nread);
ZB_API zb_status zb_store_size(zb_store *store, const char *key, uint64_t *size);
/* Reads a list of byte ranges (of one or many keys) in one call: the one place where a reader
 * hands a whole window of reads to the store, which a remote backend serves concurrently (a
 * backend without get_ranges is called once per range, in order). Keys are normalised first.
 * Every range gets its nread and status; done (may be NULL) is called on the calling thread as
 * each range completes, in completion order, so a caller can start decoding the first bytes
 * before the last arrive; when done returns non-zero, the ranges not yet complete are
 * cancelled (status ZB_E_CANCELLED). Returns the status of the first failed range in list
 * order (its message in zb_last_error), ZB_E_CANCELLED when the caller cancelled, else ZB_OK. */
ZB_API zb_status zb_store_get_ranges(zb_store *store, zb_range *ranges, size_t n, zb_range_fn done,
                                     void *ctx);
/* A view of bytes of `key` (zb_store_methods.view); ZB_E_UNSUPPORTED when the backend offers
 * none for this key. Release it with zb_store_release. The file backend maps data files
 * (mmap) up to a per-store budget: zb_store_opts.mmap_bytes (default 1 GiB; 0 turns views
 * off). A mapped file that another process truncates in place while it is mapped raises
 * SIGBUS in the reader, as with any mmap reader; zbatch's writers replace files by rename,
 * which is safe (a replaced file is noticed within a second, and its old mapping dropped). */
ZB_API zb_status zb_store_view(zb_store *store, const char *key, uint64_t offset, uint64_t length,
                               const uint8_t **data, uint64_t *nread, void **token);
ZB_API void zb_store_release(zb_store *store, void *token);
ZB_API zb_status zb_store_list(zb_store *store, const char *prefix, zb_list_fn fn, void *ctx);
ZB_API zb_status zb_store_put(zb_store *store, const char *key, const void *data, uint64_t length);
ZB_API zb_status zb_store_erase(zb_store *store, const char *key);
ZB_API zb_status zb_store_rename(zb_store *store, const char *from, const char *to);

/* Reads a whole object into a new buffer (malloc'd; free with free()). A NUL byte is appended
 * after the data (not counted in *length), so JSON documents can be parsed in place. */
ZB_API zb_status zb_store_read_all(zb_store *store, const char *key, uint8_t **data,
                                   uint64_t *length);

/* Normalises `key` into `out` (size `cap`, NUL-terminated); ZB_E_BADKEY on "." / ".." segments,
 * ZB_E_INVALID if it does not fit. */
ZB_API zb_status zb_key_normalize(const char *key, char *out, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Data types.
 * ------------------------------------------------------------------------------------------- */
typedef enum zb_dtype {
    ZB_DT_BOOL,
    ZB_DT_INT8,
    ZB_DT_INT16,
    ZB_DT_INT32,
    ZB_DT_INT64,
    ZB_DT_UINT8,
    ZB_DT_UINT16,
    ZB_DT_UINT32,
    ZB_DT_UINT64,
    ZB_DT_FLOAT16,
    ZB_DT_FLOAT32,
    ZB_DT_FLOAT64,
    ZB_DT_STRING, /* variable-length UTF-8 (v2 "|O" + vlen-utf8, v3 "string") */
    ZB_DT_COUNT_
} zb_dtype;

/* Bytes per element (0 for strings). */
ZB_API size_t zb_dtype_size(zb_dtype dtype);
/* The v3 name ("float32", "string", ...). */
ZB_API const char *zb_dtype_name(zb_dtype dtype);
/* The NumPy typestr of the in-memory form ("<f4", "|b1", "|O" for strings). */
ZB_API const char *zb_dtype_typestr(zb_dtype dtype);

#define ZB_MAX_DIMS 32

/* ---------------------------------------------------------------------------------------------
 * Codec contexts. One per thread: decompression contexts of every codec and scratch buffers,
 * grown on demand and reused.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_ctx zb_ctx;

ZB_API zb_status zb_ctx_new(zb_ctx **out);
ZB_API void zb_ctx_free(zb_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Arrays. A zb_array is opened from metadata (v2 .zarray or v3 zarr.json) and is immutable
 * afterwards: it may be shared by threads.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_array zb_array;

/* Opens the array at `path` in `store` (v2 or v3, detected from the keys present). The array
 * keeps a reference to `store`, which must outlive it. */
ZB_API zb_status zb_array_open(zb_store *store, const char *path, zb_array **out);

/* Opens an array from an already parsed metadata document (e.g. from consolidated metadata);
 * `json` is the text of .zarray (zarr_format 2, with `attrs_json` the .zattrs text or NULL) or
 * of zarr.json (zarr_format 3, attrs_json ignored). */
ZB_API zb_status zb_array_open_json(zb_store *store, const char *path, int zarr_format,
                                    const char *json, const char *attrs_json, zb_array **out);

ZB_API void zb_array_close(zb_array *array);

/* Facts about an opened array. The returned pointers live as long as the array. */
typedef struct zb_array_info {
    int zarr_format; /* 2 or 3 */
    zb_dtype dtype;
    size_t itemsize; /* bytes per element; 0 for strings */
    int ndim;
    const uint64_t *shape;       /* [ndim] */
    const uint64_t *chunk_shape; /* [ndim]: the read unit (the inner chunk when sharded) */
    const uint64_t *shard_shape; /* [ndim], or NULL when not sharded */
    const char *codecs; /* human-readable chain, e.g. "bytes(little) | blosc(lz4,5,shuffle)" */
    const char *attributes_json; /* the array's attributes as JSON text ("{}" if none) */
    const uint8_t *fill_value;   /* itemsize bytes, native byte order (NULL for strings) */
} zb_array_info;

ZB_API zb_status zb_array_get_info(const zb_array *array, zb_array_info *info);

/* Elements per row: the product of shape[1:] (1 for 1-d arrays, 1 for 0-d). */
ZB_API uint64_t zb_array_row_elems(const zb_array *array);

/* Reads rows [start, stop) along axis 0 (all of the other axes) into dst, C order, native byte
 * order. dst must hold (stop-start) * row_elems * itemsize bytes (`dst_size`). For a 0-d array
 * use start=0, stop=1. Chunks that map onto one contiguous run of dst are decoded straight into
 * it. Missing chunks and empty shard entries read as the fill value.
 * `ctx` may be NULL (a temporary one is made). Thread-safe for distinct ctx. */
ZB_API zb_status zb_array_read_rows(const zb_array *array, uint64_t start, uint64_t stop, void *dst,
                                    size_t dst_size, zb_ctx *ctx);

/* Strings read from a string array: item i is data[offsets[i] .. offsets[i+1]) (not
 * NUL-terminated). Free with zb_strings_free. */
typedef struct zb_strings {
    uint64_t n;
    uint64_t *offsets; /* [n+1] */
    char *data;
} zb_strings;

/* Reads rows [start, stop) of a string array (every element of those rows, C order). */
ZB_API zb_status zb_array_read_strings(const zb_array *array, uint64_t start, uint64_t stop,
                                       zb_strings *out, zb_ctx *ctx);
ZB_API void zb_strings_free(zb_strings *strings);

/* Statistics of a zb_ctx since it was made (or last reset), for tests and benchmarks. */
typedef struct zb_ctx_stats {
    uint64_t chunks_decoded; /* chunks (or inner chunks) run through the codec chain */
    uint64_t chunks_filled;  /* missing chunks / empty entries served as fill */
    uint64_t range_reads;    /* store get() calls */
    uint64_t bytes_fetched;  /* bytes returned by those calls */
    uint64_t bytes_decoded;  /* decoded bytes produced */
} zb_ctx_stats;

ZB_API void zb_ctx_get_stats(const zb_ctx *ctx, zb_ctx_stats *stats);
ZB_API void zb_ctx_reset_stats(zb_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Writing arrays.
 *
 * Arrays are written row by row along axis 0 (chunks and shards span every other axis). Rows are
 * appended in any number of calls; the final length need not be known in advance: the shape is
 * settled at commit. Chunks are compressed on a thread pool and written with put (temporary key
 * + rename). The metadata document is written last, at commit, so a writer killed earlier leaves
 * either no array (a new one) or the array as it was at its last commit (an append).
 *
 * Determinism: the bytes written depend only on the options and the rows, never on num_threads,
 * on how the rows were split into append calls, or on the order in which compression threads
 * finish. A chunk is encoded from its own rows (an edge chunk padded with the fill value), and
 * a shard is assembled only when all its inner chunks are encoded, each placed by its index
 * (inner chunk 0 first) with the index written in that order; nothing records a time, process
 * or thread.
 *
 * Codec strings (also the CLI's --codec): "none", "zstd[:LEVEL[:checksum]]", "lz4[:ACCEL]",
 * "gzip[:LEVEL]", "zlib[:LEVEL]", "blosc[:CNAME[:CLEVEL[:SHUFFLE]]]" with CNAME one of lz4
 * lz4hc blosclz zstd zlib snappy and SHUFFLE one of noshuffle shuffle bitshuffle
 * (e.g. "blosc:lz4:5:shuffle"). zlib and lz4 are v2-only ids; in v3 they are written as
 * numcodecs.zlib / numcodecs.lz4.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_array_write_opts {
    int zarr_format;             /* 3 (default) or 2 */
    const char *codec;           /* codec string, NULL = "blosc:lz4:5:shuffle" (measured; the
                                    anndata writer's narrow CSR arrays: zb_anndata_csr_codec) */
    uint64_t chunk_rows;         /* rows per chunk; 0 = about 1 MiB of uncompressed rows */
    uint64_t shard_rows;         /* v3 only: rows per shard, a multiple of chunk_rows; 0 = none */
    bool write_empty_chunks;     /* false: chunks equal to the fill value are not written */
    bool shard_index_at_start;   /* v3 sharding: index_location "start" */
    int num_threads;             /* compression threads; 0 or 1 = the calling thread */
    const char *attributes_json; /* the array's attributes (a JSON object), NULL = {} */
    const void *fill_value;      /* itemsize bytes, native order; NULL = zeros */
} zb_array_write_opts;

#define ZB_ARRAY_WRITE_OPTS_DEFAULT                                                                \
    {                                                                                              \
        3, NULL, 0, 0, true, false, 1, NULL, NULL                                                  \
    }

typedef struct zb_array_writer zb_array_writer;

/* Starts a new array at `path` (which must not hold an array yet: ZB_E_INVALID) with elements
 * of `dtype` and rows of shape row_shape[0..ndim-2] (ndim >= 1; row_shape may be NULL for
 * ndim 1). The store must outlive the writer. Not thread-safe: one thread drives a writer. */
ZB_API zb_status zb_array_writer_open(zb_store *store, const char *path, zb_dtype dtype, int ndim,
                                      const uint64_t *row_shape, const zb_array_write_opts *opts,
                                      zb_array_writer **out);

/* Reopens an existing array (written by zbatch or anyone else, v2 or v3, chunked along axis 0
 * only) to append rows to it. Its codec, chunking and format are kept; opts may be NULL (only
 * num_threads is read from it). The last partial chunk (or shard) is rewritten with the new
 * rows. */
ZB_API zb_status zb_array_writer_open_append(zb_store *store, const char *path,
                                             const zb_array_write_opts *opts,
                                             zb_array_writer **out);

/* Appends `nrows` rows (C order, native byte order) of fixed-size elements. */
ZB_API zb_status zb_array_writer_append(zb_array_writer *w, const void *rows, uint64_t nrows);

/* Appends `n` strings to a string array (1-d): string i is data[offsets[i] .. offsets[i+1]). */
ZB_API zb_status zb_array_writer_append_strings(zb_array_writer *w, const char *data,
                                                const uint64_t *offsets, uint64_t n);

/* Rows appended so far plus the rows the array had when opened. */
ZB_API uint64_t zb_array_writer_rows(const zb_array_writer *w);

/* Flushes every pending chunk and writes the metadata (the commit point). The writer can take
 * more rows after a commit and commit again. */
ZB_API zb_status zb_array_writer_commit(zb_array_writer *w);

/* Frees the writer. Rows appended since the last commit are discarded (their chunks may remain
 * as unreferenced objects that readers never see). */
ZB_API void zb_array_writer_close(zb_array_writer *w);

/* ---------------------------------------------------------------------------------------------
 * Datasets: N logical samples and named fields (DESIGN.md §2).
 *
 * A field is per-sample (an array [N, ...]), ragged (an array [total, ...] split into samples by
 * a segment: a pointer array ptr[N+1]) or index (a ragged field whose values point into another
 * segment and are re-based to the batch). The layout is detected from the store's attributes:
 * "anndata", "atomic", "collection" (annbatch's pre-shuffled collections and zbatch
 * collections) or "generic" (a `zbatch` attribute, docs/FORMATS-zbatch.md).
 *
 * Opening reads metadata only, except for collections, which read their children's var names
 * and category tables to check and merge them (zb_dataset_concat says how; a collection
 * stored on disk refuses disagreeing children with ZB_E_CORRUPT). Pointer arrays are read
 * lazily by chunk and cached; a soft-delete mask (atomic `meta/samples_mask`) is read once, on
 * the first call that needs it. A zb_dataset may be shared by threads (its caches are locked).
 *
 * anndata: X is CSR (fields "X/data", "X/indices" over segment "X") or dense (field "X"); a
 * CSC X is refused (ZB_E_UNSUPPORTED: `zbatch convert` writes it as CSR). obs columns are
 * fields "obs/NAME": numbers and booleans as stored, categoricals as their codes, nullable
 * columns as values plus a "/mask" companion (zb_field_info.mask); strings on request
 * (zb_dataset_opts.load_strings). zb_dataset_column lists obs as anndata does.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_dataset zb_dataset;

typedef enum zb_field_kind {
    ZB_FIELD_PER_SAMPLE, /* row i of an [N, ...] array */
    ZB_FIELD_RAGGED,     /* rows [ptr[i], ptr[i+1]) of an array, ptr from the field's segment */
    ZB_FIELD_INDEX       /* ragged, and its values index rows of `target` segment */
} zb_field_kind;

/* zb_dataset_opts.on_invalid: what a read does with a sample whose stored values are invalid. */
typedef enum zb_on_invalid {
    ZB_ON_INVALID_ERROR = 0, /* the read fails with ZB_E_CORRUPT */
    ZB_ON_INVALID_SKIP = 1   /* the sample is left out and counted */
} zb_on_invalid;

typedef struct zb_dataset_opts {
    bool load_layers;           /* anndata: also expose layers/NAME as fields */
    bool load_obsm;             /* anndata: expose obsm/NAME (default true) */
    bool use_consolidated;      /* use consolidated metadata when present (default true) */
    size_t cache_bytes;         /* decoded-chunk cache (LRU); 0 = off */
    int num_threads;            /* decode threads for read_many; 0 or 1 = the calling thread */
    size_t inline_work_bytes;   /* a read_many whose chunks decode to at most this many bytes
                                   runs on the calling thread, not the decode threads (the
                                   hand-off costs more than a second thread saves); default
                                   512 KiB, 0 = always the decode threads */
    bool load_strings;          /* anndata: the obs index ("obs_names") and string obs columns
                                   (string-array, nullable-string-array) are fields of dtype
                                   ZB_DT_STRING, read into every batch (zb_batch_view says how
                                   strings lie in a batch). Default false: batches carry
                                   fixed-size fields only, and zb_dataset_read_strings still
                                   reads any string column. */
    const char *layer;          /* anndata: the matrix batches carry as X. NULL or "X": X;
                                   "raw": raw/X (with raw/var as the var names); any other
                                   name: layers/NAME (ZB_E_NOTFOUND if absent). The fields
                                   keep X's names ("X/data" and "X/indices", or "X" when
                                   dense), so transforms and densify act on this matrix. The
                                   string is copied at open. */
    bool reorder_vars;          /* collections and zb_dataset_concat: a child whose var names
                                   are the first child's in another order is delivered in the
                                   first child's order (its X columns remapped as batches are
                                   built: CSR gene ids mapped and each row re-sorted, dense
                                   rows permuted; a cost per cell of such children only).
                                   Default false: children whose var names differ are refused
                                   at open. Children with other genes are refused either way. */
    const char *x_dtype;        /* anndata: the dtype batches carry the values of CSR
                                   matrices in (X/data, layers/NAME/data), the stored values
                                   widened to it as they are copied (a store of integer counts
                                   may hold them as uint8/uint16: half the bytes to fetch and
                                   decode, docs/PERFORMANCE.md). NULL (default): "float32"
                                   when they are stored as integers of up to 16 bits (uint8,
                                   int8, uint16, int16), so a narrow store reads as its
                                   float32 twin; else as stored. "stored": always as stored.
                                   A dtype name ("float32", "float64", "int32", "int64"): that
                                   dtype; ZB_E_INVALID at open when it does not hold every
                                   stored value exactly (float32 from float64, int32 from
                                   float32, ...). A dense X is delivered as stored. Read at
                                   open only (a collection's children all take it;
                                   zb_dataset_concat takes the dtypes its children were opened
                                   with). */
    const char *index_dtype;    /* anndata: the same for the gene ids of CSR matrices
                                   (X/indices, layers/NAME/indices). NULL (default): "int32"
                                   when stored as integers of up to 16 bits (anndata's
                                   uint8/uint16 indices of a narrow store), else as stored;
                                   "stored"; or "int32"/"int64". */
    zb_on_invalid on_invalid;   /* what a read does with a sample whose stored values are
                                   invalid (docs/ERRORS.md "Invalid data"): ZB_ON_INVALID_ERROR
                                   (default) fails the read with ZB_E_CORRUPT naming the sample
                                   id, the field and the chunk; ZB_ON_INVALID_SKIP leaves such
                                   samples out of the batch (it is smaller) and counts them in
                                   zb_read_stats.samples_skipped. Collections and concatenations
                                   take the option of the dataset read, not the children's. */
    uint64_t max_request_bytes; /* the cap on one request's batch memory (read_many, one loader
                                   window): a request needing more is refused with
                                   ZB_E_INVALID before anything is allocated. Default (and 0)
                                   ZB_MAX_REQUEST_BYTES_DEFAULT. */
    size_t fetch_cache_bytes;   /* stores that read lists of ranges themselves (http, https,
                                   s3): the encoded bytes of the units fetched (shard inner
                                   chunks, chunk objects) are kept, least recently used out
                                   first, up to this many bytes, so a unit that later windows
                                   need again is not fetched again (a local store's reads hit
                                   the operating system's page cache instead). The store's
                                   objects are assumed not to change while the dataset is open.
                                   Default ZB_FETCH_CACHE_BYTES_DEFAULT (256 MiB); 0 = off.
                                   Other stores ignore it. */
} zb_dataset_opts;

#define ZB_MAX_REQUEST_BYTES_DEFAULT ((uint64_t)16 << 30)
#define ZB_FETCH_CACHE_BYTES_DEFAULT ((size_t)256 << 20)

#define ZB_DATASET_OPTS_DEFAULT                                                                    \
    {                                                                                              \
        false, true, true, 0, 1, (size_t)512 << 10, false, NULL, false, NULL, NULL,                \
            ZB_ON_INVALID_ERROR, ZB_MAX_REQUEST_BYTES_DEFAULT, ZB_FETCH_CACHE_BYTES_DEFAULT        \
    }

typedef struct zb_field_info {
    const char *name; /* "X/data", "obs/cell_line", "positions", ... */
    zb_field_kind kind;
    zb_dtype dtype;
    int ndim;                  /* of one sample's rows: 0 for a scalar per sample */
    const uint64_t *row_shape; /* [ndim]: shape of one row (array shape[1:]) */
    const char *segment;       /* ragged/index: the segment's name ("X", "atoms", "edges") */
    const char *target;        /* index: the segment its values point into, else NULL */
    bool categorical;          /* codes with a category table (zb_dataset_category_table);
                                  -1 = missing */
    const char *array;         /* the store path of the values array (of the first child) */
    const char *mask;          /* nullable columns (anndata nullable-integer, -boolean and
                                  -string-array): the name of the companion field holding
                                  their missing flags ("obs/NAME/mask": bool per sample, true =
                                  missing; the value under a true flag is unspecified). NULL
                                  for other fields. */
} zb_field_info;

ZB_API zb_status zb_dataset_open(zb_store *store, const char *path, const zb_dataset_opts *opts,
                                 zb_dataset **out);
ZB_API void zb_dataset_close(zb_dataset *ds);

/* The layout name ("anndata", "atomic", "collection", "generic"); lives as long as ds. */
ZB_API const char *zb_dataset_layout(const zb_dataset *ds);

/* Logical samples (soft-deleted samples excluded). May read the mask on first call. */
ZB_API zb_status zb_dataset_len(zb_dataset *ds, uint64_t *n);

ZB_API size_t zb_dataset_nfields(const zb_dataset *ds);
ZB_API zb_status zb_dataset_field(const zb_dataset *ds, size_t i, zb_field_info *info);
/* The index of the field named `name`; ZB_E_NOTFOUND. */
ZB_API zb_status zb_dataset_find_field(const zb_dataset *ds, const char *name, size_t *index);

/* Number of columns of an anndata X (n_vars); 0 for other layouts. */
ZB_API uint64_t zb_dataset_n_vars(const zb_dataset *ds);

/* Where the dataset lives, for messages: the store's name (zb_store_name) and the dataset's
 * group in it ("/data/atlas.zarr", "/data/atlas.zarr/dataset_3"); a concatenation's is its
 * first child's followed by "+" and the number of others. Lives as long as ds. */
ZB_API const char *zb_dataset_name(const zb_dataset *ds);

/* The labels of a categorical field, typed: strings (an anndata categorical of str) or numbers
 * and booleans of `dtype` (integer leiden clusters, float or bool categories). Pointers live as
 * long as the dataset. A collection's table is its children's when they all agree, else the
 * sorted union of their tables (by UTF-8 bytes for strings, by value for numbers: the table
 * anndata.concat builds); the codes in its batches index this table (every child's stored
 * codes are remapped as batches are built), so a code means the same label in every batch. */
typedef struct zb_category_table {
    zb_dtype dtype;            /* ZB_DT_STRING, or the labels' numeric dtype (ZB_DT_BOOL...) */
    uint64_t n;                /* labels */
    const zb_strings *strings; /* ZB_DT_STRING: the labels; else NULL */
    const void *values;        /* numeric: n labels of dtype, native byte order; else NULL */
    bool ordered;              /* the categorical's `ordered` attribute (a collection's: the
                                  first child's when the tables agree, else false) */
} zb_category_table;

ZB_API zb_status zb_dataset_category_table(zb_dataset *ds, const char *field,
                                           zb_category_table *out);

/* The string labels of a categorical field (zb_dataset_category_table's strings);
 * ZB_E_TYPE naming the labels' dtype when they are not strings. */
ZB_API zb_status zb_dataset_categories(zb_dataset *ds, const char *field, const zb_strings **out);

/* The var names of an anndata dataset or collection (var's index; raw/var's with layer "raw"):
 * zb_dataset_n_vars strings, the column order of X in batches. Read on first call; owned by
 * ds. ZB_E_NOTFOUND for other layouts. */
ZB_API zb_status zb_dataset_var_names(zb_dataset *ds, const zb_strings **out);

/* The columns of obs (anndata layouts and collections of them), as anndata lists them: the
 * index first ("obs_names"), then every column of obs's column-order that zbatch reads, named
 * "obs/NAME". Columns of other encodings are left out. */
typedef enum zb_column_kind {
    ZB_COLUMN_VALUES,          /* numbers or booleans: field NAME */
    ZB_COLUMN_CATEGORICAL,     /* codes: field NAME, labels: zb_dataset_category_table */
    ZB_COLUMN_NULLABLE,        /* nullable-integer/-boolean: fields NAME and NAME/mask */
    ZB_COLUMN_STRINGS,         /* string-array (and the index): zb_dataset_read_strings */
    ZB_COLUMN_NULLABLE_STRINGS /* nullable-string-array: zb_dataset_read_strings with
                                   its missing flags */
} zb_column_kind;

typedef struct zb_column_info {
    const char *name; /* "obs_names", "obs/NAME"; lives as long as ds */
    zb_column_kind kind;
    zb_dtype dtype; /* of the values (codes for a categorical); ZB_DT_STRING for strings */
} zb_column_info;

ZB_API size_t zb_dataset_ncolumns(const zb_dataset *ds);
ZB_API zb_status zb_dataset_column(const zb_dataset *ds, size_t i, zb_column_info *info);

/* Reads logical samples [start, stop) of a per-sample field into dst (`dst_size` bytes, at
 * least (stop - start) * row elements * item size of the field's dtype as zb_dataset_field
 * tells it), in sample order, as batches carry it: a collection's categorical codes remapped to
 * its table, soft-deleted samples skipped. Whole columns for class-balanced sampling or a data
 * frame, without reading anything else. Thread-safe. ZB_E_TYPE for ragged and string fields. */
ZB_API zb_status zb_dataset_read_field(zb_dataset *ds, const char *field, uint64_t start,
                                       uint64_t stop, void *dst, size_t dst_size);

/* Reads logical samples [start, stop) of a string column ("obs_names", or a string or
 * nullable-string obs column: zb_dataset_column) into *out (free with zb_strings_free), whether
 * or not load_strings made it a field. `missing` (NULL, or stop - start bytes) receives 1 for a
 * missing value (nullable-string-array's mask; a missing value's string is empty), else 0.
 * Thread-safe. */
ZB_API zb_status zb_dataset_read_strings(zb_dataset *ds, const char *column, uint64_t start,
                                         uint64_t stop, zb_strings *out, uint8_t *missing);

/* The length of every logical sample in segment `segment` ("X" nonzeros, "atoms", "edges"):
 * out[i] = ptr[p+1] - ptr[p] for the physical row p of logical sample i; `out` holds
 * zb_dataset_len entries. Reads the pointer arrays (8 bytes per sample), not the values. */
ZB_API zb_status zb_dataset_segment_lengths(zb_dataset *ds, const char *segment, uint64_t *out);

/* A dataset over `n` datasets in order: one index space, the child of each sample in batches
 * ("dataset"). The children are borrowed: they must outlive the result and offer the same
 * fields (names, kinds, dtypes, row shapes; categorical codes may differ in width) and, for
 * anndata, the same var names: ZB_E_INVALID otherwise, naming both children (zb_dataset_name)
 * and the difference (for var names the first differing position). opts->reorder_vars accepts
 * children whose genes are the first child's in another order. Categorical fields get one
 * table (zb_dataset_category_table) and their codes are remapped in batches; a field's dtype
 * (zb_dataset_field) is then the narrowest signed type that holds every child's codes and the
 * merged table. The opts' num_threads, cache_bytes, inline_work_bytes and reorder_vars apply;
 * the children's own options decide their fields. Opening reads every child's var names and
 * category tables. */
ZB_API zb_status zb_dataset_concat(zb_dataset *const *children, size_t n,
                                   const zb_dataset_opts *opts, zb_dataset **out);

/* Replaces the decode thread pool (waits for a read in progress). */
ZB_API zb_status zb_dataset_set_threads(zb_dataset *ds, int num_threads);

/* Number of child datasets (collections), else 1. */
ZB_API size_t zb_dataset_nchildren(const zb_dataset *ds);

/* ---------------------------------------------------------------------------------------------
 * Batches and the coalesced reader.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_batch zb_batch;

/* A field's data inside a batch. Pointers live until zb_batch_free. */
typedef struct zb_batch_view {
    const char *name;
    zb_field_kind kind;
    zb_dtype dtype;
    void *data;     /* contiguous, batch order, native byte order; strings: the UTF-8
                               bytes of every sample's string, one after the other */
    uint64_t nrows; /* rows in the batch (B for per-sample, the element total else) */
    int ndim;       /* of one row */
    const uint64_t *row_shape;
    const int64_t *ptr; /* ragged/index: the batch pointer array [B+1] of its segment;
                               strings (dtype ZB_DT_STRING, per-sample): sample i's string is
                               data[ptr[i] .. ptr[i+1]) (not NUL-terminated) */
} zb_batch_view;

typedef struct zb_read_stats {
    uint64_t chunks_decoded;  /* units (chunks or inner chunks) run through codecs */
    uint64_t chunks_cached;   /* units served from the decoded-chunk cache */
    uint64_t chunks_filled;   /* missing units served as fill */
    uint64_t bytes_fetched;   /* bytes read from the store */
    uint64_t bytes_decoded;   /* decoded bytes produced */
    uint64_t bytes_delivered; /* bytes copied into the batch */
    uint64_t range_reads;     /* store reads */
    uint64_t samples_skipped; /* samples left out as invalid (zb_dataset_opts.on_invalid) */
} zb_read_stats;

/* Reads the samples `ids` (logical, any order, duplicates allowed) as one batch in the
 * requested order. Every chunk (or shard inner chunk) the request touches is decoded at most
 * once, in parallel on the dataset's threads (on the calling thread when the chunks decode to
 * no more than zb_dataset_opts.inline_work_bytes). Out-of-range ids: ZB_E_RANGE naming the id.
 * Stored values are validated as they are delivered (docs/ERRORS.md "Invalid data"): pointers
 * within their values (before allocating), CSR column ids within n_vars, categorical codes
 * within their categories, index fields within their sample; a violation is ZB_E_CORRUPT
 * naming the sample id, the field and the chunk, or with zb_dataset_opts.on_invalid =
 * ZB_ON_INVALID_SKIP the sample is left out of the batch and counted in
 * zb_read_stats.samples_skipped. A request over zb_dataset_opts.max_request_bytes is
 * ZB_E_INVALID before anything is allocated.
 * Thread-safe: any number of threads may read one dataset at once. */
ZB_API zb_status zb_dataset_read_many(zb_dataset *ds, const uint64_t *ids, size_t n,
                                      zb_batch **out);

ZB_API void zb_batch_free(zb_batch *batch);
ZB_API size_t zb_batch_size(const zb_batch *batch); /* B */
ZB_API size_t zb_batch_nfields(const zb_batch *batch);
ZB_API zb_status zb_batch_field(const zb_batch *batch, size_t i, zb_batch_view *view);
ZB_API zb_status zb_batch_find(const zb_batch *batch, const char *name, zb_batch_view *view);
/* The logical ids [B], and for collections the child index of each sample [B] (else NULL). */
ZB_API const uint64_t *zb_batch_index(const zb_batch *batch);
ZB_API const int32_t *zb_batch_dataset(const zb_batch *batch);
/* A segment's batch pointer array [B+1] ("X", "atoms", "edges"), or NULL. */
ZB_API const int64_t *zb_batch_segment(const zb_batch *batch, const char *segment);
/* The segments of a batch by position: name and pointer array [B+1]; NULL past the end. */
ZB_API size_t zb_batch_nsegments(const zb_batch *batch);
ZB_API const char *zb_batch_segment_at(const zb_batch *batch, size_t i, const int64_t **ptr);
ZB_API void zb_batch_stats(const zb_batch *batch, zb_read_stats *stats);

/* ---------------------------------------------------------------------------------------------
 * Copying and converting stores.
 * ------------------------------------------------------------------------------------------- */
typedef struct zb_copy_opts {
    int zarr_format;       /* of the copy: 3 (default) or 2 */
    const char *codec;     /* codec string of every array (NULL = the writer's default) */
    uint64_t chunk_bytes;  /* uncompressed bytes per chunk (rows rounded down, >= 1 row) */
    int num_threads;       /* compression threads */
    bool skip_unsupported; /* skip arrays zbatch cannot read (0-d, unsupported dtypes) */
} zb_copy_opts;

#define ZB_COPY_OPTS_DEFAULT                                                                       \
    {                                                                                              \
        3, NULL, (uint64_t)1 << 20, 1, true                                                        \
    }

/* Copies the tree below src_path of `src` to dst_path of `dst`: every group with its
 * attributes, every array decoded and re-encoded with the options (row blocks of 64 MiB, so
 * memory is bounded). Arrays are committed first, groups after their contents, the root last.
 * Consolidated metadata is not written. */
ZB_API zb_status zb_store_copy(zb_store *src, const char *src_path, zb_store *dst,
                               const char *dst_path, const zb_copy_opts *opts);

/* ---------------------------------------------------------------------------------------------
 * Store inspection (what `zbatch info` prints).
 * ------------------------------------------------------------------------------------------- */

/* Describes the tree of groups and arrays under `path` of `store` as a JSON document (malloc'd,
 * free with free()): {"path", "zarr_format", "layout", "consolidated", "nodes": [...]}; each node
 * has "path", "type" ("group"/"array"), "attributes", and arrays also "shape", "dtype",
 * "chunks", "shards", "codecs", "stored_bytes", "logical_bytes". `layout` is "anndata",
 * "atomic", "annbatch-collection" or "plain". */
ZB_API zb_status zb_info_json(zb_store *store, const char *path, char **json_out);

#ifdef __cplusplus
}
#endif

/* The layout writers, neighbour lists, samplers and the loader. */
#include "zbatch_anndata.h"
#include "zbatch_convert.h"
#include "zbatch_atomic.h"
#include "zbatch_loader.h"
#include "zbatch_neighbors.h"
#include "zbatch_sampler.h"
#include "zbatch_verify.h"

#endif /* ZBATCH_H */
