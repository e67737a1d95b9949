/* The zbatch command: dispatches to one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "zbatch.h"

static void
usage(FILE *f)
{
    fprintf(f,
            "zbatch %s — feed training loops from Zarr stores\n"
            "\n"
            "usage: zbatch <command> [options]\n"
            "\n"
            "commands:\n"
            "  info PATH [--json]   the tree of groups and arrays, codecs, sizes and layout\n"
            "  synth --kind K ...   generate a realistic synthetic store (cells or atoms)\n"
            "  verify PATH          check a store: metadata, chunks, pointers, masks\n"
            "  convert IN... -o OUT .h5ad files and anndata stores into a pre-shuffled\n"
            "                       collection; --from ase / --from lmdb: structures into an\n"
            "                       atomic store\n"
            "  convert SRC DST      re-encode a store (format, codec, chunk size)\n"
            "  repair STORE [-o OUT] a corrected copy of an atomic store whose edge indices\n"
            "                       nvalchemi's append/defragment damaged, written beside it\n"
            "  bench STORE ...      loader throughput next to the decode-only limit\n"
            "\n"
            "info, verify and bench read http(s):// and s3://bucket/prefix URLs; convert writes\n"
            "into s3:// (OUT, DST) and re-encodes from either (SRC). S3 credentials, region and\n"
            "endpoint come from the AWS_* variables, then the AWS_PROFILE (or default) profile\n"
            "of ~/.aws/credentials and ~/.aws/config (docs/REMOTE.md).\n"
            "\n"
            "Run 'zbatch <command> --help' for a command's options.\n",
            ZB_VERSION_STRING);
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("zbatch %s\n", ZB_VERSION_STRING);
        return 0;
    }
    if (!strcmp(cmd, "info")) return zb__cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return zb__cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return zb__cli_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return zb__cli_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return zb__cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "repair")) return zb__cli_python(argc - 1, argv + 1);
    fprintf(stderr, "zbatch: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
