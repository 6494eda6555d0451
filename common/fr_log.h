/* fr_log.h - leveled logging to stderr (stdout belongs to program output).
 * Thread-safe: each message is formatted into one buffer and written with a
 * single write(2). The level comes from FERRUM_LOG (error|warn|info|debug),
 * default info. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FR_LOG_ERROR = 0, FR_LOG_WARN, FR_LOG_INFO, FR_LOG_DEBUG } fr_log_level_t;

void fr_log(fr_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int fr_log_enabled(fr_log_level_t level);
void fr_log_set_level(fr_log_level_t level);
/* A short tag written in front of every line ("coord", "worker0"); copied. */
void fr_log_set_tag(const char *tag);

#define FR_LOGE(...) fr_log(FR_LOG_ERROR, __VA_ARGS__)
#define FR_LOGW(...) fr_log(FR_LOG_WARN, __VA_ARGS__)
#define FR_LOGI(...) fr_log(FR_LOG_INFO, __VA_ARGS__)
#define FR_LOGD(...) fr_log(FR_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
