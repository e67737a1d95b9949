/* Codec strings (the writer's `codec` option and the CLI's --codec) and the codec JSON the
 * writers emit. The grammar is documented in include/zbatch.h ("Writing arrays"):
 *   none | zstd[:LEVEL[:checksum]] | lz4[:ACCEL] | gzip[:LEVEL] | zlib[:LEVEL]
 *   | blosc[:CNAME[:CLEVEL[:SHUFFLE]]]
 * Defaults for omitted parts: zstd level 3 (zstd's own default level), lz4 acceleration 1,
 * gzip and zlib level 1 (numcodecs' defaults), blosc lz4 / clevel 5 / shuffle (numcodecs'
 * Blosc defaults). Format facts: shared FORMATS.md §2.1 (v2 JSON), §3.4 (v3 JSON). */
#ifndef ZB_WRITE_CODEC_SPEC_H
#define ZB_WRITE_CODEC_SPEC_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "zarr/codec.h"
#include "zbatch.h"

/* The codec used when the option is NULL, chosen by measurement (docs/PERFORMANCE.md "Codec
 * defaults"). */
#define ZB_CODEC_SPEC_DEFAULT "blosc:lz4:5:shuffle"
/* The anndata writer's default for a CSR matrix's data / indices of 1- and 2-byte integers
 * (zb_anndata_csr_codec): byte shuffle there halves LZ4's decode speed for ~20% fewer bytes
 * (docs/PERFORMANCE.md "Codec defaults", 2026-12-04). */
#define ZB_CODEC_SPEC_NARROW_INT "blosc:lz4:5:noshuffle"

/* Parses `spec` (NULL = ZB_CODEC_SPEC_DEFAULT) for a Zarr `zarr_format` (2 or 3) array into
 * *codec; *has_codec is false for "none". ZB_E_INVALID, naming the string and the part that is
 * wrong, for a malformed string, a value out of range, or a combination the format cannot
 * express (zstd checksum in v2: numcodecs 0.11 rejects the key); ZB_E_UNSUPPORTED for a blosc
 * compressor this libblosc lacks. */
zb_status zb__codec_spec_parse(const char *spec, int zarr_format, zb__codec *codec,
                               bool *has_codec);

/* The v2 compressor object with exactly numcodecs 0.11's key set (FORMATS.md §2.1):
 * blosc {id,cname,clevel,shuffle,blocksize}, zstd {id,level}, lz4 {id,acceleration},
 * gzip/zlib {id,level}. ZB_E_INVALID for what v2 cannot express (zstd checksum, crc32c). */
zb_status zb__codec_v2_json(const zb__codec *codec, json_object **out);

/* The v3 codec entry: blosc (typesize = itemsize, 1 for strings), zstd {level, checksum},
 * gzip, crc32c, and numcodecs.zlib / numcodecs.lz4 for the v2-only ids. */
zb_status zb__codec_v3_json(const zb__codec *codec, size_t itemsize, json_object **out);

#endif
