/* model_impl.h - internal helpers shared by model_load.c and dummy.c. */
#pragma once

#include "model/model.h"

model_t *model__new(kern_backend_t *be, const model_load_opts_t *opts);
int model__check_config(const model_config_t *c);
/* Keeps a host buffer (malloc'd) alive until model_destroy. */
void model__keep(model_t *m, void *p);
int model__init_rope(model_t *m);
int model__alloc_scratch(model_t *m);
