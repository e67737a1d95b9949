/* Codec strings to zb__codec, and zb__codec to v2 / v3 codec JSON.
 * Format facts: shared FORMATS.md §2.1 (numcodecs 0.11 key sets), §2.2 (blosc), §3.4 (v3). */
#include "write/codec_spec.h"

#include <blosc.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "util/status.h"
#include "write/write.h"

#define SPEC_CAP 128
#define MAX_PARTS 4

/* numcodecs' Blosc.cname values (FORMATS.md §2.2). */
static const char *const blosc_cnames[] = {"lz4", "lz4hc", "blosclz", "zstd", "zlib", "snappy"};
static const char *const shuffle_names[] = {[ZB_SHUFFLE_NONE] = "noshuffle",
                                            [ZB_SHUFFLE_BYTE] = "shuffle",
                                            [ZB_SHUFFLE_BIT] = "bitshuffle"};

/* A decimal integer in [lo, hi] spanning the whole part. */
static zb_status
int_part(const char *spec, const char *part, const char *what, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(part, &end, 10);
    if (!*part || *end || errno)
        return zb__err(ZB_E_INVALID, "codec \"%s\": %s \"%s\" is not an integer", spec, what, part);
    if (v < lo || v > hi)
        return zb__err(ZB_E_INVALID, "codec \"%s\": %s %ld is outside %ld..%ld", spec, what, v, lo,
                       hi);
    *out = (int)v;
    return ZB_OK;
}

static zb_status
want_parts(const char *spec, const char *name, int nparts, int most)
{
    if (nparts - 1 > most)
        return zb__err(ZB_E_INVALID, "codec \"%s\": %s takes at most %d parameter%s", spec, name,
                       most, most == 1 ? "" : "s");
    return ZB_OK;
}

static zb_status
parse_blosc(const char *spec, char **parts, int nparts, zb__codec *c)
{
    ZB_TRY(want_parts(spec, "blosc", nparts, 3));
    c->id = ZB_CODEC_BLOSC;
    c->level = 5;
    c->shuffle = ZB_SHUFFLE_BYTE;
    c->blocksize = 0;
    c->typesize = 0; /* the dtype's item size, at encode time */
    const char *cname = nparts > 1 ? parts[1] : "lz4";
    bool known = false;
    for (size_t i = 0; i < sizeof blosc_cnames / sizeof blosc_cnames[0]; i++)
        known = known || !strcmp(cname, blosc_cnames[i]);
    if (!known)
        return zb__err(ZB_E_INVALID,
                       "codec \"%s\": blosc compressor \"%s\" is not one of lz4 lz4hc blosclz "
                       "zstd zlib snappy",
                       spec, cname);
    /* checked now rather than at the first chunk, so a bad option fails at open */
    if (blosc_compname_to_compcode(cname) < 0)
        return zb__err(ZB_E_UNSUPPORTED, "codec \"%s\": this libblosc lacks \"%s\" (it has %s)",
                       spec, cname, blosc_list_compressors());
    snprintf(c->cname, sizeof c->cname, "%s", cname);
    if (nparts > 2) ZB_TRY(int_part(spec, parts[2], "blosc clevel", 0, 9, &c->level));
    if (nparts > 3) {
        int found = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(parts[3], shuffle_names[i])) found = i;
        if (found < 0)
            return zb__err(ZB_E_INVALID,
                           "codec \"%s\": blosc shuffle \"%s\" is not noshuffle, shuffle or "
                           "bitshuffle",
                           spec, parts[3]);
        c->shuffle = found;
    }
    return ZB_OK;
}

zb_status
zb__codec_spec_parse(const char *spec, int zarr_format, zb__codec *codec, bool *has_codec)
{
    if (!codec || !has_codec) return zb__err(ZB_E_INVALID, "zb__codec_spec_parse: null out");
    memset(codec, 0, sizeof *codec);
    *has_codec = false;
    if (!spec) spec = ZB_CODEC_SPEC_DEFAULT;
    if (zarr_format != 2 && zarr_format != 3)
        return zb__err(ZB_E_INVALID, "codec \"%.64s\": zarr_format %d is not 2 or 3", spec,
                       zarr_format);
    char copy[SPEC_CAP];
    if (strlen(spec) >= sizeof copy)
        return zb__err(ZB_E_INVALID, "codec \"%.64s...\" is too long", spec);
    memcpy(copy, spec, strlen(spec) + 1);

    char *parts[MAX_PARTS + 1];
    int nparts = 0;
    for (char *p = copy;; nparts++) {
        if (nparts > MAX_PARTS)
            return zb__err(ZB_E_INVALID, "codec \"%s\" has too many ':' parts", spec);
        parts[nparts] = p;
        char *colon = strchr(p, ':');
        if (!colon) {
            nparts++;
            break;
        }
        *colon = '\0';
        p = colon + 1;
    }
    for (int i = 0; i < nparts; i++)
        if (!parts[i][0])
            return zb__err(ZB_E_INVALID, "codec \"%s\": part %d is empty", spec, i + 1);

    const char *name = parts[0];
    zb__codec *c = codec;
    if (!strcmp(name, "none")) {
        ZB_TRY(want_parts(spec, name, nparts, 0));
        return ZB_OK;
    }
    if (!strcmp(name, "zstd")) {
        ZB_TRY(want_parts(spec, name, nparts, 2));
        c->id = ZB_CODEC_ZSTD;
        c->level = 3;
        if (nparts > 1)
            ZB_TRY(int_part(spec, parts[1], "zstd level", ZSTD_minCLevel(), ZSTD_maxCLevel(),
                            &c->level));
        if (nparts > 2) {
            if (strcmp(parts[2], "checksum") != 0)
                return zb__err(ZB_E_INVALID,
                               "codec \"%s\": zstd's third part must be "
                               "\"checksum\", not \"%s\"",
                               spec, parts[2]);
            /* numcodecs 0.11 raises TypeError on a "checksum" key (FORMATS.md §2.1) */
            if (zarr_format == 2)
                return zb__err(ZB_E_INVALID,
                               "codec \"%s\": zstd checksum cannot be written in Zarr v2 "
                               "(numcodecs 0.11 rejects the key); use zarr_format 3",
                               spec);
            c->checksum = true;
        }
    } else if (!strcmp(name, "lz4")) {
        ZB_TRY(want_parts(spec, name, nparts, 1));
        c->id = ZB_CODEC_LZ4;
        c->acceleration = 1;
        /* LZ4_ACCELERATION_MAX */
        if (nparts > 1)
            ZB_TRY(int_part(spec, parts[1], "lz4 acceleration", 1, 65537, &c->acceleration));
    } else if (!strcmp(name, "gzip") || !strcmp(name, "zlib")) {
        ZB_TRY(want_parts(spec, name, nparts, 1));
        c->id = name[0] == 'g' ? ZB_CODEC_GZIP : ZB_CODEC_ZLIB;
        c->level = 1;
        if (nparts > 1)
            ZB_TRY(int_part(spec, parts[1], name[0] == 'g' ? "gzip level" : "zlib level", 0, 9,
                            &c->level));
    } else if (!strcmp(name, "blosc")) {
        ZB_TRY(parse_blosc(spec, parts, nparts, c));
    } else {
        return zb__err(ZB_E_INVALID,
                       "codec \"%s\": \"%s\" is not none, zstd, lz4, gzip, zlib or blosc", spec,
                       name);
    }
    *has_codec = true;
    return ZB_OK;
}

/* Closes a document built with zb_jw_*: *out on success, NOMEM (and nothing kept) otherwise. */
static zb_status
finish(json_object *obj, int ok, const char *what, json_object **out)
{
    if (!ok || !obj) {
        json_object_put(obj);
        return zb__err(ZB_E_NOMEM, "%s codec JSON: out of memory", what);
    }
    *out = obj;
    return ZB_OK;
}

zb_status
zb__codec_v2_json(const zb__codec *c, json_object **out)
{
    *out = NULL;
    int ok = 1;
    json_object *o = json_object_new_object();
    /* Key order as zarr-python 2.13 writes them (sorted), to keep diffs against it small. */
    switch (c->id) {
    case ZB_CODEC_BLOSC:
        zb__jw_add(o, "blocksize", json_object_new_int(c->blocksize), &ok);
        zb__jw_add(o, "clevel", json_object_new_int(c->level), &ok);
        zb__jw_add(o, "cname", json_object_new_string(c->cname), &ok);
        zb__jw_add(o, "id", json_object_new_string("blosc"), &ok);
        zb__jw_add(o, "shuffle", json_object_new_int(c->shuffle), &ok);
        break;
    case ZB_CODEC_ZSTD:
        if (c->checksum) {
            json_object_put(o);
            return zb__err(ZB_E_INVALID, "zstd checksum cannot be written in Zarr v2 "
                                         "(numcodecs 0.11 rejects the key)");
        }
        zb__jw_add(o, "id", json_object_new_string("zstd"), &ok);
        zb__jw_add(o, "level", json_object_new_int(c->level), &ok);
        break;
    case ZB_CODEC_LZ4:
        zb__jw_add(o, "acceleration", json_object_new_int(c->acceleration), &ok);
        zb__jw_add(o, "id", json_object_new_string("lz4"), &ok);
        break;
    case ZB_CODEC_GZIP:
    case ZB_CODEC_ZLIB:
        zb__jw_add(o, "id", json_object_new_string(c->id == ZB_CODEC_GZIP ? "gzip" : "zlib"), &ok);
        zb__jw_add(o, "level", json_object_new_int(c->level), &ok);
        break;
    case ZB_CODEC_CRC32C:
    default:
        json_object_put(o);
        return zb__err(ZB_E_INVALID, "this codec has no Zarr v2 compressor form");
    }
    return finish(o, ok, "v2", out);
}

zb_status
zb__codec_v3_json(const zb__codec *c, size_t itemsize, json_object **out)
{
    *out = NULL;
    int ok = 1;
    json_object *o = json_object_new_object();
    json_object *cfg = NULL;
    const char *name;
    switch (c->id) {
    case ZB_CODEC_BLOSC:
        name = "blosc";
        break;
    case ZB_CODEC_ZSTD:
        name = "zstd";
        break;
    case ZB_CODEC_GZIP:
        name = "gzip";
        break;
    /* zarr-python 3.1 has no v3 zlib / lz4 codecs of its own; it reads and writes the numcodecs
     * ids under these names, with numcodecs' parameters (FORMATS.md §3.4) */
    case ZB_CODEC_ZLIB:
        name = "numcodecs.zlib";
        break;
    case ZB_CODEC_LZ4:
        name = "numcodecs.lz4";
        break;
    case ZB_CODEC_CRC32C:
        name = "crc32c";
        break;
    default:
        json_object_put(o);
        return zb__err(ZB_E_INVALID, "unknown codec id %d", (int)c->id);
    }
    zb__jw_add(o, "name", json_object_new_string(name), &ok);
    if (c->id != ZB_CODEC_CRC32C)
        cfg = zb__jw_add(o, "configuration", json_object_new_object(), &ok);
    switch (c->id) {
    case ZB_CODEC_BLOSC: {
        /* v3 needs typesize whenever it shuffles; strings (itemsize 0) shuffle bytes of 1 */
        int ts = c->typesize > 0 ? c->typesize : itemsize > 0 ? (int)itemsize : 1;
        int sh = c->shuffle;
        if (sh == ZB_SHUFFLE_AUTO) sh = ts == 1 ? ZB_SHUFFLE_BIT : ZB_SHUFFLE_BYTE;
        if (sh < ZB_SHUFFLE_NONE || sh > ZB_SHUFFLE_BIT) {
            json_object_put(o);
            return zb__err(ZB_E_INVALID, "blosc shuffle %d has no v3 form", c->shuffle);
        }
        zb__jw_add(cfg, "cname", json_object_new_string(c->cname), &ok);
        zb__jw_add(cfg, "clevel", json_object_new_int(c->level), &ok);
        zb__jw_add(cfg, "shuffle", json_object_new_string(shuffle_names[sh]), &ok);
        zb__jw_add(cfg, "typesize", json_object_new_int(ts), &ok);
        zb__jw_add(cfg, "blocksize", json_object_new_int(c->blocksize), &ok);
        break;
    }
    case ZB_CODEC_ZSTD:
        zb__jw_add(cfg, "level", json_object_new_int(c->level), &ok);
        /* zarr-python always writes the flag, false included */
        zb__jw_add(cfg, "checksum", json_object_new_boolean(c->checksum), &ok);
        break;
    case ZB_CODEC_GZIP:
    case ZB_CODEC_ZLIB:
        zb__jw_add(cfg, "level", json_object_new_int(c->level), &ok);
        break;
    case ZB_CODEC_LZ4:
        zb__jw_add(cfg, "acceleration", json_object_new_int(c->acceleration), &ok);
        break;
    case ZB_CODEC_CRC32C:
        break;
    }
    return finish(o, ok, "v3", out);
}
