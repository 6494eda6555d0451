/* file.h - how the model readers open the files and folders they are given
 * (internal to model/: gguf.c, safetensors.c, config.c, source.c,
 * tokenizer_json.c).
 *
 * A path from a user may name anything: a FIFO (whose open() blocks until a
 * writer comes), a device, a socket, a folder where a file is meant. The
 * readers open every path through model__path_open, which never blocks and
 * accepts only the kinds asked for: it stats the path first (a FIFO or a
 * device is refused without being opened), opens it with O_NONBLOCK, then
 * checks the open descriptor again with fstat, so a path swapped between
 * the check and the open is caught too. Symlinks are followed (users link
 * model files into place).
 *
 * Threads: any; no state.
 */
#pragma once

#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a path may be (a bit set). */
enum { MODEL_PATH_FILE = 1, MODEL_PATH_DIR = 2 };

/* Opens path read-only (O_CLOEXEC, blocking mode once open) when it is one
 * of kinds. Returns 0 with *fd and, when st is not NULL, its fstat in *st;
 * else a negative error (-errno from open/stat, FR_EFORMAT for a path of
 * the wrong kind) whose message starts with "<what>: " and names the path
 * ("gguf: m.gguf is not a regular file"), and no descriptor left open. */
int model__path_open(const char *what, const char *path, unsigned kinds, int *fd, struct stat *st);

/* Reads a whole regular file (at most max bytes) into a NUL-terminated
 * buffer (malloc'd, *out; its length in *len when len is not NULL).
 * Errors as model__path_open, FR_ETOOBIG past max. */
int model__file_read(const char *what, const char *path, size_t max, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
