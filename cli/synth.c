/* zbatch synth — realistic synthetic stores, reproducible by seed. The kinds live in their own
 * files (synth_cells.c, synth_atoms.c); this file only dispatches on --kind. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void
usage(FILE *f)
{
    fprintf(f, "usage: zbatch synth --kind cells|atoms --n N -o PATH [--seed S] "
               "[--format v2|v3] [--codec CODEC] [options of the kind]\n"
               "  cells: Tahoe-like AnnData (62,710 genes, lognormal nonzeros per cell)\n"
               "  atoms: nvalchemi AtomicData structures (10-200 atoms, neighbour lists)\n"
               "Run 'zbatch synth --kind K --help' for the options of a kind.\n");
}

int
zb__cli_synth(int argc, char **argv)
{
    const char *kind = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kind") && i + 1 < argc) kind = argv[i + 1];
        if (!strncmp(argv[i], "--kind=", 7)) kind = argv[i] + 7;
    }
    if (!kind) {
        bool help = false;
        for (int i = 1; i < argc; i++)
            help = help || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (!strcmp(kind, "cells")) return zb__cli_synth_cells(argc, argv);
    if (!strcmp(kind, "atoms")) return zb__cli_synth_atoms(argc, argv);
    fprintf(stderr, "zbatch synth: unknown --kind '%s' (cells or atoms)\n", kind);
    return 2;
}
