/* proto_corpus.c - writes seed inputs for the proto fuzz targets: random
 * valid messages of every type, one file each, into DIR/<family>/.
 *
 *   proto_corpus DIR [per_type] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "proto_testutil.h"

static const char *family(proto_type_t t) {
  switch (t) {
  case PROTO_T_STEP: return "step";
  case PROTO_T_RESULT: return "result";
  case PROTO_T_HELLO: case PROTO_T_LOAD: case PROTO_T_LOADED: case PROTO_T_HEARTBEAT: case PROTO_T_SHUTDOWN:
  case PROTO_T_KV_INIT: case PROTO_T_KV_READY:
    return "worker";
  default: return "rpc";
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: proto_corpus DIR [per_type]\n");
    return 2;
  }
  int per = argc > 2 ? atoi(argv[2]) : 20;
  char path[4096];
  mkdir(argv[1], 0755);
  proto_buf_t b;
  proto_buf_init(&b);
  for (int t = 1; t < PROTO_T_COUNT; t++) {
    snprintf(path, sizeof path, "%s/%s", argv[1], family((proto_type_t)t));
    if (mkdir(path, 0755) && errno != EEXIST) return 1;
    for (int i = 0; i < per; i++) {
      _Alignas(16) unsigned char body[sizeof(((proto_msg_t *)0)->u)];
      tu_rand_body((proto_type_t)t, body, i % 4 == 0 ? 2 : 0);
      if (proto_encode(&b, (proto_type_t)t, body)) return 1;
      snprintf(path, sizeof path, "%s/%s/%s-%03d", argv[1], family((proto_type_t)t), proto_type_name(t), i);
      FILE *f = fopen(path, "wb");
      if (!f || fwrite(b.data, 1, b.len, f) != b.len) return 1;
      fclose(f);
      tu_free_all();
    }
  }
  proto_buf_free(&b);
  return 0;
}
