/* zbatch info PATH [--json]: the tree of groups and arrays of a store, with codecs, sizes and
 * the detected layout. --json prints zb_info_json's document; the default is a tree for
 * people, drawn from that same document so the two never disagree. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util/json.h"
#include "zbatch.h"

static void
usage(FILE *f)
{
    fprintf(f, "usage: zbatch info PATH [--json]\n"
               "\n"
               "Prints the groups and arrays of the Zarr store at PATH (v2 or v3): shapes,\n"
               "dtypes, chunk and shard shapes, codecs, stored and logical sizes, and the\n"
               "detected layout (anndata, atomic, annbatch-collection or plain).\n"
               "\n"
               "  --json     print the description as one JSON document\n"
               "  -h, --help this text\n");
}

static int
fail(zb_status st)
{
    fprintf(stderr, "zbatch info: %s: %s\n", zb_strerror(st), zb_last_error());
    return 1;
}

static void
human_bytes(uint64_t n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)n);
        return;
    }
    double x = (double)n;
    int u = 0;
    while (x >= 1024.0 && u < 6) {
        x /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", x, units[u]);
}

static void
print_dims(json_object *dims)
{
    putchar('[');
    size_t n = json_object_array_length(dims);
    for (size_t i = 0; i < n; i++)
        printf("%s%s", i ? ", " : "",
               json_object_to_json_string(json_object_array_get_idx(dims, i)));
    putchar(']');
}

static void
print_size(const char *label, json_object *v)
{
    char buf[32];
    if (!json_object_is_type(v, json_type_int)) {
        printf("  %s -", label);
        return;
    }
    human_bytes(zb__json_is_big_uint(v) ? json_object_get_uint64(v)
                                        : (uint64_t)json_object_get_int64(v),
                buf, sizeof buf);
    printf("  %s %s", label, buf);
}

static void
print_node(json_object *node, const char *root)
{
    const char *path = json_object_get_string(zb__json_get(node, "path"));
    bool is_array = !strcmp(json_object_get_string(zb__json_get(node, "type")), "array");
    /* depth below the root, and the last segment as the name */
    const char *rel = path + strlen(root);
    if (*rel == '/') rel++;
    int depth = 0;
    const char *name = rel;
    for (const char *p = rel; *p; p++) {
        if (*p != '/') continue;
        depth++;
        name = p + 1;
    }
    if (*rel) depth++;
    printf("%*s%s%s", 2 * depth, "", *rel ? name : "/", is_array || !*rel ? "" : "/");

    json_object *attrs = zb__json_get(node, "attributes");
    json_object *et = zb__json_get(attrs, "encoding-type");
    if (!is_array) {
        if (json_object_is_type(et, json_type_string)) printf("  (%s)", json_object_get_string(et));
        putchar('\n');
        return;
    }
    json_object *err = zb__json_get(node, "error");
    if (err) {
        printf("  error: %s\n", json_object_get_string(err));
        return;
    }
    printf("  %s ", json_object_get_string(zb__json_get(node, "dtype")));
    print_dims(zb__json_get(node, "shape"));
    printf("  chunks ");
    print_dims(zb__json_get(node, "chunks"));
    json_object *shards = zb__json_get(node, "shards");
    if (shards) {
        printf("  shards ");
        print_dims(shards);
    }
    printf("  %s", json_object_get_string(zb__json_get(node, "codecs")));
    print_size("stored", zb__json_get(node, "stored_bytes"));
    print_size("logical", zb__json_get(node, "logical_bytes"));
    if (json_object_is_type(et, json_type_string)) printf("  (%s)", json_object_get_string(et));
    putchar('\n');
}

static int
print_tree(const char *store_path, const char *text)
{
    json_object *doc = NULL;
    zb_status st = zb__json_parse(text, strlen(text), "info", &doc);
    if (st != ZB_OK) return fail(st);
    const char *root = json_object_get_string(zb__json_get(doc, "path"));
    printf("%s: zarr v%d, layout %s%s\n", store_path,
           json_object_get_int(zb__json_get(doc, "zarr_format")),
           json_object_get_string(zb__json_get(doc, "layout")),
           json_object_get_boolean(zb__json_get(doc, "consolidated")) ? ", consolidated metadata"
                                                                      : "");
    json_object *nodes = zb__json_get(doc, "nodes");
    size_t n = json_object_array_length(nodes);
    for (size_t i = 0; i < n; i++) print_node(json_object_array_get_idx(nodes, i), root);
    json_object_put(doc);
    return 0;
}

int
zb__cli_info(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "zbatch info: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "zbatch info: more than one PATH\n\n");
            usage(stderr);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    zb_store *store = NULL;
    zb_status st = zb__cli_store_open(path, &store);
    if (st != ZB_OK) return fail(st);
    char *text = NULL;
    st = zb_info_json(store, "", &text);
    zb_store_close(store);
    if (st != ZB_OK) return fail(st);
    int rc = 0;
    if (json)
        printf("%s\n", text);
    else
        rc = print_tree(path, text);
    free(text);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "zbatch info: cannot write output\n");
        rc = 1;
    }
    return rc;
}
