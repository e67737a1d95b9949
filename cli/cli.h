/* Subcommands of the zbatch command; each returns the process exit code (0 ok, 1 error,
 * 2 bad usage). argv[0] is the subcommand's name. */
#ifndef ZB_CLI_H
#define ZB_CLI_H

#include "zbatch.h"

int zb__cli_info(int argc, char **argv);
int zb__cli_synth(int argc, char **argv);
int zb__cli_synth_cells(int argc, char **argv);
int zb__cli_synth_atoms(int argc, char **argv);
int zb__cli_verify(int argc, char **argv);
int zb__cli_convert(int argc, char **argv);
int zb__cli_bench(int argc, char **argv);
/* Runs `python -m zbatch ARGV...` (argv[0] is the subcommand) for the jobs the Python package
 * does; returns only when Python cannot be started. */
int zb__cli_python(int argc, char **argv);

/* ZBATCH_MMAP_BYTES into *bytes when it is set (left alone otherwise): ZB_E_INVALID when it is
 * not a number of bytes. */
zb_status zb__cli_mmap_bytes(uint64_t *bytes);

/* zb_store_open with the options of the environment: ZBATCH_MMAP_BYTES (bytes of data files
 * one store may map; 0 = pread only) becomes zb_store_opts.mmap_bytes (a value that is not a
 * number of bytes is ZB_E_INVALID naming the variable); an http(s):// or s3:// URL takes its
 * options from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION /
 * AWS_DEFAULT_REGION and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (anonymous without keys). */
zb_status zb__cli_store_open(const char *url, zb_store **out);
/* The remote options the environment gives: the standard AWS variables, then the profile of the
 * AWS shared files (strings borrowed from the environment and the process-wide profile).
 * Errors: a malformed file (naming file and line), a profile AWS_PROFILE names but no file has. */
zb_status zb__cli_remote_opts(zb_remote_opts *r);

#endif
