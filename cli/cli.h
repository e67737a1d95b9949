/* Subcommands of the zbatch command; each returns the process exit code. */
#ifndef ZB_CLI_H
#define ZB_CLI_H

int zb_cli_info(int argc, char **argv);

#endif
