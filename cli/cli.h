/* Subcommands of the zbatch command; each returns the process exit code (0 ok, 1 error,
 * 2 bad usage). argv[0] is the subcommand's name. */
#ifndef ZB_CLI_H
#define ZB_CLI_H

#include "zbatch.h"

/* Opens a store given on the command line: a path, or an http(s):// or s3:// URL whose options
 * come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION /
 * AWS_DEFAULT_REGION and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (anonymous without keys). */
zb_status zb_cli_store_open(const char *url, zb_store **out);

int zb_cli_info(int argc, char **argv);
int zb_cli_synth(int argc, char **argv);
int zb_cli_synth_cells(int argc, char **argv);
int zb_cli_synth_atoms(int argc, char **argv);
int zb_cli_verify(int argc, char **argv);
int zb_cli_convert(int argc, char **argv);
int zb_cli_bench(int argc, char **argv);
/* Runs `python -m zbatch ARGV...` (argv[0] is the subcommand) for the jobs the Python package
 * does; returns only when Python cannot be started. */
int zb_cli_python(int argc, char **argv);

#endif
