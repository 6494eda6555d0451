/* cli_bench.c - `ferrumctl bench` (being written). */
#include <stdio.h>

#include "coordinator/cli.h"

int cli_cmd_bench(int argc, char **argv) {
  fprintf(stderr, "ferrumctl bench: not implemented yet\n");
  return 1;
}
