/* zbatch synth --kind atoms */
#include <stdio.h>

#include "cli.h"

int
zb_cli_synth_atoms(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "zbatch synth --kind atoms: not implemented yet\n");
    return 1;
}
