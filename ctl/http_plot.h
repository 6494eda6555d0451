/* http_plot.h - a line chart as a PNG (libpng), for `ferrumctl bench
 * --plot`: axes with ticks and numbers, points joined by lines, a label
 * per point, axis titles, drawn with a built-in 5x7 bitmap font.
 *
 * Threads: no shared state. Ownership: inputs are borrowed for the call.
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  double x, y;
  const char *label; /* drawn beside the point, or NULL */
} cli_plot_point_t;

/* Draws the points (in the order given, joined by lines) into a width x
 * height RGB PNG at path. Returns 0 or a negative error (fr_errorf). */
int cli_plot_png(const char *path, const cli_plot_point_t *pts, int n, const char *title, const char *xlabel,
                 const char *ylabel, int width, int height);

#ifdef __cplusplus
}
#endif
