/* fr_submit.c - submits one prompt to a ferrum coordinator over the RPC
 * protocol and prints the streamed text as it arrives.
 *
 *   fr_submit [-e endpoint] [-n max_tokens] [-t temperature] [-s seed]
 *             [-m model] [-c] "prompt"
 *
 * -c sends the prompt as a chat message (the model's chat template
 * applies). The default endpoint is tcp://127.0.0.1:5555. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "proto/fr_client.h"

static void usage(void) {
  fprintf(stderr, "usage: fr_submit [-e endpoint] [-n max_tokens] [-t temperature] [-s seed] [-m model] [-c] prompt\n");
}

static int run(const char *endpoint, proto_submit_t *req) {
  fr_client_t *c;
  int rc = fr_client_connect(&c, endpoint);
  if (rc) return rc;
  uint64_t id;
  if ((rc = fr_client_submit(c, req, &id))) goto out;
  proto_event_t ev;
  while ((rc = fr_client_next_event(c, 60000, &ev)) == 0) {
    if (ev.id != id) continue;
    if (ev.text) fwrite(ev.text, 1, ev.text_len, stdout);
    fflush(stdout);
    if (ev.finish == PROTO_FINISH_NONE) continue;
    if (ev.finish == PROTO_FINISH_ERROR) {
      rc = fr_errorf(FR_EPROTO, "job failed: %d %s", ev.error.code, ev.error.message ? ev.error.message : "");
    } else {
      printf("\n");
      if (ev.has_usage)
        fprintf(stderr, "[%s: %u prompt + %u completion tokens, %u cached]\n", proto_finish_name(ev.finish),
                ev.usage.prompt_tokens, ev.usage.completion_tokens, ev.usage.cached_tokens);
    }
    break;
  }
out:
  fr_client_close(c);
  return rc;
}

int main(int argc, char **argv) {
  const char *endpoint = "tcp://127.0.0.1:5555";
  proto_submit_t req = {.sp = proto_sampling_default(), .max_tokens = 128, .stream = true};
  int chat = 0, opt;
  while ((opt = getopt(argc, argv, "e:n:t:s:m:ch")) != -1) {
    switch (opt) {
    case 'e': endpoint = optarg; break;
    case 'n': req.max_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
    case 't': req.sp.temperature = strtof(optarg, NULL); break;
    case 's':
      req.sp.has_seed = true;
      req.sp.seed = strtoull(optarg, NULL, 10);
      break;
    case 'm': req.model = optarg; break;
    case 'c': chat = 1; break;
    default: usage(); return 2;
    }
  }
  if (optind != argc - 1) {
    usage();
    return 2;
  }
  proto_chat_msg_t msg = {.role = "user", .content = argv[optind]};
  if (chat) {
    req.messages = &msg;
    req.n_messages = 1;
  } else {
    req.prompt = argv[optind];
  }
  int rc = run(endpoint, &req);
  if (rc) {
    fprintf(stderr, "fr_submit: %s\n", fr_last_error());
    return 1;
  }
  return 0;
}
