/* zbatch info — placeholder until the tree walker lands. */
#include <stdio.h>

#include "cli.h"

int
zb_cli_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "zbatch info: not built yet\n");
    return 1;
}
