/* zbatch bench — placeholder until the benchmark lands. */
#include <stdio.h>

#include "cli.h"

int
zb_cli_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "zbatch bench: not built yet\n");
    return 1;
}
