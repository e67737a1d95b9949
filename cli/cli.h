/* Subcommands of the zbatch command; each returns the process exit code (0 ok, 1 error,
 * 2 bad usage). argv[0] is the subcommand's name. */
#ifndef ZB_CLI_H
#define ZB_CLI_H

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
