/* http_plot.c - see http_plot.h. A tiny raster: an RGB canvas, Bresenham
 * lines, filled squares and a 5x7 font; written out with libpng. */
#include "ctl/http_plot.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#include "common/fr_err.h"
#include "common/fr_util.h"

typedef struct {
  int w, h;
  uint8_t *px; /* (h, w, 3) */
} plot_canvas_t;

typedef struct {
  uint8_t r, g, b;
} plot_rgb_t;

static const plot_rgb_t PLOT_BLACK = {0, 0, 0}, PLOT_GREY = {220, 220, 220}, PLOT_BLUE = {31, 119, 180},
                        PLOT_RED = {214, 39, 40};

/* 5x7 glyphs: 7 rows of 5 bits (bit 4 = left column). */
static const struct {
  char c;
  uint8_t rows[7];
} plot_font[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},     {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {31, 2, 4, 2, 1, 17, 14}},     {'4', {2, 6, 10, 18, 31, 2, 2}},    {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},      {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}}, {'D', {28, 18, 17, 17, 17, 18, 28}}, {'E', {31, 16, 16, 30, 16, 16, 31}},
    {'F', {31, 16, 16, 30, 16, 16, 16}}, {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},      {'J', {7, 2, 2, 2, 2, 18, 12}},     {'K', {17, 18, 20, 24, 20, 18, 17}},
    {'L', {16, 16, 16, 16, 16, 16, 31}}, {'M', {17, 27, 21, 21, 17, 17, 17}}, {'N', {17, 17, 25, 21, 19, 17, 17}},
    {'O', {14, 17, 17, 17, 17, 17, 14}}, {'P', {30, 17, 17, 30, 16, 16, 16}}, {'Q', {14, 17, 17, 17, 21, 18, 13}},
    {'R', {30, 17, 17, 30, 20, 18, 17}}, {'S', {15, 16, 16, 14, 1, 1, 30}},   {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}}, {'V', {17, 17, 17, 17, 17, 10, 4}},  {'W', {17, 17, 17, 21, 21, 21, 10}},
    {'X', {17, 17, 10, 4, 10, 17, 17}},  {'Y', {17, 17, 17, 10, 4, 4, 4}},    {'Z', {31, 1, 2, 4, 8, 16, 31}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},      {'-', {0, 0, 0, 31, 0, 0, 0}},      {'/', {0, 1, 2, 4, 8, 16, 0}},
    {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},       {'=', {0, 0, 31, 0, 31, 0, 0}},
    {':', {0, 12, 12, 0, 12, 12, 0}},    {',', {0, 0, 0, 0, 12, 4, 8}},      {'+', {0, 4, 4, 31, 4, 4, 0}},
    {'%', {24, 25, 2, 4, 8, 19, 3}},     {'_', {0, 0, 0, 0, 0, 0, 31}},
};

static void plot_set(plot_canvas_t *c, int x, int y, plot_rgb_t col) {
  if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
  uint8_t *p = c->px + ((size_t)y * c->w + x) * 3;
  p[0] = col.r, p[1] = col.g, p[2] = col.b;
}

static void plot_line(plot_canvas_t *c, int x0, int y0, int x1, int y1, plot_rgb_t col) {
  int dx = abs(x1 - x0), sx = x0 < x1 ? 1 : -1, dy = -abs(y1 - y0), sy = y0 < y1 ? 1 : -1, err = dx + dy;
  for (;;) {
    plot_set(c, x0, y0, col);
    if (x0 == x1 && y0 == y1) return;
    int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

static void plot_box(plot_canvas_t *c, int cx, int cy, int r, plot_rgb_t col) {
  for (int y = cy - r; y <= cy + r; y++)
    for (int x = cx - r; x <= cx + r; x++) plot_set(c, x, y, col);
}

/* Draws text at (x, y) (top left), scale s; vertical: rotated 90 degrees
 * counter-clockwise, reading bottom to top. Returns the width in pixels. */
static int plot_text(plot_canvas_t *c, int x, int y, const char *s, int sc, bool vertical, plot_rgb_t col) {
  int adv = 0;
  for (; *s; s++, adv += 6 * sc) {
    char ch = (char)toupper((unsigned char)*s);
    for (size_t g = 0; g < sizeof plot_font / sizeof plot_font[0]; g++) {
      if (plot_font[g].c != ch) continue;
      for (int r = 0; r < 7; r++)
        for (int b = 0; b < 5; b++) {
          if (!(plot_font[g].rows[r] >> (4 - b) & 1)) continue;
          for (int i = 0; i < sc; i++)
            for (int j = 0; j < sc; j++) {
              int gx = adv + b * sc + i, gy = r * sc + j;
              if (vertical) plot_set(c, x + gy, y - gx, col);
              else plot_set(c, x + gx, y + gy, col);
            }
        }
      break;
    }
  }
  return adv;
}

/* A "nice" tick step (1, 2, 5 x 10^k) for a range split in about n parts. */
static double plot_step(double range, int n) {
  double raw = range / n, mag = pow(10, floor(log10(raw))), f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

static int plot_write_png(const plot_canvas_t *c, const char *path) {
  FILE *f = fopen(path, "wb");
  if (!f) return fr_errorf(-errno, "plot: cannot write %s", path);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    fclose(f);
    return fr_errorf(FR_EFORMAT, "plot: libpng failed writing %s", path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < c->h; y++) png_write_row(png, c->px + (size_t)y * c->w * 3);
  png_write_end(png, NULL);
  png_destroy_write_struct(&png, &info);
  return fclose(f) ? fr_errorf(-EIO, "plot: cannot write %s", path) : 0;
}

typedef struct {
  int x0, y0, x1, y1; /* plot area in pixels: left, bottom, right, top */
  double xmin, xmax, ymin, ymax, xstep, ystep;
} plot_frame_t;

static int plot_px(const plot_frame_t *f, double x) { return f->x0 + (int)lround((x - f->xmin) / (f->xmax - f->xmin) * (f->x1 - f->x0)); }
static int plot_py(const plot_frame_t *f, double y) { return f->y0 - (int)lround((y - f->ymin) / (f->ymax - f->ymin) * (f->y0 - f->y1)); }

static void plot_range(const cli_plot_point_t *pts, int n, bool y, double *lo, double *hi, double *step) {
  double mx = 0;
  for (int i = 0; i < n; i++) mx = fmax(mx, y ? pts[i].y : pts[i].x);
  if (!(mx > 0) || !isfinite(mx)) mx = 1;
  *lo = 0;
  *step = plot_step(mx * 1.1, 5);
  *hi = ceil(mx * 1.1 / *step) * *step;
}

static void plot_axes(plot_canvas_t *c, const plot_frame_t *f) {
  char num[32];
  for (double v = f->xmin; v <= f->xmax + f->xstep / 2; v += f->xstep) {
    int x = plot_px(f, v);
    plot_line(c, x, f->y0, x, f->y1, PLOT_GREY);
    plot_line(c, x, f->y0, x, f->y0 + 5, PLOT_BLACK);
    snprintf(num, sizeof num, "%g", v);
    plot_text(c, x - (int)strlen(num) * 6 / 2 * 2, f->y0 + 10, num, 2, false, PLOT_BLACK);
  }
  for (double v = f->ymin; v <= f->ymax + f->ystep / 2; v += f->ystep) {
    int y = plot_py(f, v);
    plot_line(c, f->x0, y, f->x1, y, PLOT_GREY);
    plot_line(c, f->x0 - 5, y, f->x0, y, PLOT_BLACK);
    snprintf(num, sizeof num, "%g", v);
    plot_text(c, f->x0 - 10 - (int)strlen(num) * 12, y - 7, num, 2, false, PLOT_BLACK);
  }
  plot_line(c, f->x0, f->y0, f->x1, f->y0, PLOT_BLACK);
  plot_line(c, f->x0, f->y0, f->x0, f->y1, PLOT_BLACK);
}

int cli_plot_png(const char *path, const cli_plot_point_t *pts, int n, const char *title, const char *xlabel,
                 const char *ylabel, int width, int height) {
  if (width < 200 || height < 150 || width > 8000 || height > 8000) return fr_errorf(-EINVAL, "plot: bad size");
  plot_canvas_t c = {width, height, fr_malloc((size_t)width * height * 3)};
  memset(c.px, 255, (size_t)width * height * 3);
  plot_frame_t f = {.x0 = 110, .y0 = height - 80, .x1 = width - 40, .y1 = 60};
  plot_range(pts, n, false, &f.xmin, &f.xmax, &f.xstep);
  plot_range(pts, n, true, &f.ymin, &f.ymax, &f.ystep);
  plot_axes(&c, &f);
  if (title) plot_text(&c, (width - (int)strlen(title) * 12) / 2, 20, title, 2, false, PLOT_BLACK);
  if (xlabel) plot_text(&c, (f.x0 + f.x1 - (int)strlen(xlabel) * 12) / 2, height - 35, xlabel, 2, false, PLOT_BLACK);
  if (ylabel) plot_text(&c, 15, (f.y0 + f.y1 + (int)strlen(ylabel) * 12) / 2, ylabel, 2, true, PLOT_BLACK);
  for (int i = 0; i + 1 < n; i++)
    for (int t = 0; t < 9; t++) /* 3 px thick at any slope */
      plot_line(&c, plot_px(&f, pts[i].x) + t % 3 - 1, plot_py(&f, pts[i].y) + t / 3 - 1,
                plot_px(&f, pts[i + 1].x) + t % 3 - 1, plot_py(&f, pts[i + 1].y) + t / 3 - 1, PLOT_BLUE);
  for (int i = 0; i < n; i++) {
    plot_box(&c, plot_px(&f, pts[i].x), plot_py(&f, pts[i].y), 4, PLOT_RED);
    if (pts[i].label) plot_text(&c, plot_px(&f, pts[i].x) + 8, plot_py(&f, pts[i].y) - 20, pts[i].label, 2, false, PLOT_BLACK);
  }
  int rc = plot_write_png(&c, path);
  free(c.px);
  return rc;
}
