/* http_plot.c - the bench latency-throughput PNG (being written). */
typedef int coord__http_plot_placeholder;
