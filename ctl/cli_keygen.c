/* cli_keygen.c - `ferrumctl keygen --out PREFIX`: a CURVE key pair for a
 * server, a client or a remote worker (PREFIX.key, mode 0600, and
 * PREFIX.pub); the public key is printed on stdout. */
#include <getopt.h>
#include <stdio.h>

#include "common/fr_err.h"
#include "ctl/cli.h"
#include "proto/curve.h"

int cli_cmd_keygen(int argc, char **argv) {
  static const struct option lo[] = {{"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  const char *prefix = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (c == 'o') prefix = optarg;
    else {
      fprintf(c == 'h' ? stdout : stderr,
              "usage: ferrumctl keygen --out PREFIX\n"
              "  writes PREFIX.key (the key pair, mode 0600: give it to --curve-key) and PREFIX.pub (the\n"
              "  public key: a server's for clients' --server-key, a client's for the server's\n"
              "  --curve-clients list); prints the public key\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (!prefix || optind != argc) {
    fprintf(stderr, "ferrumctl keygen: give --out PREFIX\n");
    return 2;
  }
  proto_curve_pair_t kp;
  int rc = proto_curve_generate(&kp);
  if (!rc) rc = proto_curve_write(&kp, prefix);
  if (rc) {
    fprintf(stderr, "ferrumctl keygen: %s\n", fr_last_error());
    return 1;
  }
  printf("%s\n", kp.pub);
  return 0;
}
