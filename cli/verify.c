/* zbatch verify PATH */
#include <stdio.h>

#include "cli.h"

int
zb_cli_verify(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "zbatch verify: not implemented yet\n");
    return 1;
}
