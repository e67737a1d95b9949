/* zbatch synth --kind cells */
#include <stdio.h>

#include "cli.h"

int
zb_cli_synth_cells(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "zbatch synth --kind cells: not implemented yet\n");
    return 1;
}
