/* The JSON record of a `zbatch bench` run: the environment every record carries (zbatch and
 * library versions, git commit, machine) and writing the record to the results directory.
 * JSON goes through json-c (STYLE.md 13). */
#include <blosc.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <libdeflate.h>
#include <lz4.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "bench_common.h"

#define SCHEMA "zbatch-bench/1"

void
zb__bench_put(json_object *obj, const char *key, json_object *val)
{
    json_object_object_add(obj, key, val);
}

void
zb__bench_put_u64(json_object *obj, const char *key, uint64_t v)
{
    json_object_object_add(obj, key, json_object_new_uint64(v));
}

void
zb__bench_put_double(json_object *obj, const char *key, double v)
{
    json_object_object_add(obj, key, isfinite(v) ? json_object_new_double(v) : NULL);
}

void
zb__bench_put_str(json_object *obj, const char *key, const char *s)
{
    json_object_object_add(obj, key, s ? json_object_new_string(s) : NULL);
}

void
zb__bench_human_bytes(double n, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (n >= 1024.0 && u < 5) {
        n /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%.0f B", n);
    else
        snprintf(buf, cap, "%.1f %s", n, units[u]);
}

int
zb__bench_make_dirs(const char *path)
{
    char buf[4096];
    if (!*path || snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* ---- the environment ---------------------------------------------------------------------- */

/* HEAD of the git checkout holding the current directory, or NULL (no git, not a checkout). */
static json_object *
git_commit(void)
{
    FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
    if (!p) return NULL;
    char line[128] = "";
    bool got = fgets(line, sizeof line, p) != NULL;
    int rc = pclose(p);
    if (!got || rc != 0) return NULL;
    size_t n = 0;
    while (isxdigit((unsigned char)line[n])) n++;
    if (n < 40) return NULL;
    line[n] = '\0';
    return json_object_new_string(line);
}

/* The value of the first "key<spaces>: value" line of a /proc file. */
static bool
proc_field(const char *file, const char *key, char *out, size_t cap)
{
    FILE *f = fopen(file, "r");
    if (!f) return false;
    char line[1024];
    size_t kl = strlen(key);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl)) continue;
        const char *v = line + kl;
        while (*v == ' ' || *v == '\t') v++;
        if (*v != ':') continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(out, cap, "%s", v);
        out[strcspn(out, "\n")] = '\0';
        found = true;
    }
    fclose(f);
    return found;
}

static json_object *
machine(void)
{
    json_object *m = json_object_new_object();
    char buf[512];
    zb__bench_put_str(m, "cpu_model",
                      proc_field("/proc/cpuinfo", "model name", buf, sizeof buf) ? buf : NULL);
    long np = sysconf(_SC_NPROCESSORS_ONLN);
    zb__bench_put(m, "nproc", np > 0 ? json_object_new_int64(np) : NULL);
    /* MemTotal is given in kB (KiB) */
    if (proc_field("/proc/meminfo", "MemTotal", buf, sizeof buf))
        zb__bench_put_u64(m, "mem_total_bytes", strtoull(buf, NULL, 10) * 1024ull);
    else
        zb__bench_put(m, "mem_total_bytes", NULL);
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(buf, sizeof buf, "%s %s %s", u.sysname, u.release, u.machine);
        zb__bench_put_str(m, "kernel", buf);
    } else {
        zb__bench_put(m, "kernel", NULL);
    }
    return m;
}

static json_object *
libraries(void)
{
    json_object *l = json_object_new_object();
    zb__bench_put_str(l, "blosc", blosc_get_version_string());
    zb__bench_put_str(l, "zstd", ZSTD_versionString());
    zb__bench_put_str(l, "lz4", LZ4_versionString());
    zb__bench_put_str(l, "libdeflate", LIBDEFLATE_VERSION_STRING);
    zb__bench_put_str(l, "json-c", json_c_version());
    return l;
}

json_object *
zb__bench_record_new(const char *mode, char *stamp, size_t cap)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char iso[64];
    strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
    strftime(stamp, cap, "%Y%m%dT%H%M%SZ", &tm);

    json_object *r = json_object_new_object();
    zb__bench_put_str(r, "schema", SCHEMA);
    zb__bench_put_str(r, "mode", mode);
    zb__bench_put_str(r, "timestamp", iso);
    zb__bench_put_str(r, "zbatch_version", ZB_VERSION_STRING);
    zb__bench_put(r, "git_commit", git_commit());
    zb__bench_put(r, "libraries", libraries());
    zb__bench_put(r, "machine", machine());
    return r;
}

int
zb__bench_record_write(json_object *rec, const char *dir, const char *stamp, const char *suffix,
                       char *path, size_t cap)
{
    if (zb__bench_make_dirs(dir) != 0) {
        fprintf(stderr, "zbatch bench: cannot create %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int fd = -1;
    for (int k = 1; k < 1000 && fd < 0; k++) {
        if (k == 1)
            snprintf(path, cap, "%s/bench-%s-%s.json", dir, stamp, suffix);
        else
            snprintf(path, cap, "%s/bench-%s-%s-%d.json", dir, stamp, suffix, k);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        fprintf(stderr, "zbatch bench: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    const char *text = json_object_to_json_string_ext(rec, JSON_C_TO_STRING_PRETTY |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    bool ok = done == len && write(fd, "\n", 1) == 1;
    if (close(fd) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "zbatch bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}
