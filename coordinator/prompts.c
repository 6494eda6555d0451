/* prompts.c - prompt tokenization off the loop thread. A submit's text (or
 * chat messages, rendered with the template) is tokenized by a small pool
 * of threads, so a multi-megabyte prompt never stalls the streams the loop
 * serves; the loop finishes the job's intake when the ids come back (an
 * eventfd in its poll set, coord__prompts_on_ready).
 *
 * Threads: the pool's threads read only their task and the tokenizer,
 * which is immutable once loaded (model/tok_internal.h). Tasks point at
 * their job, but only the loop thread touches jobs: a job in a task is
 * marked `tokenizing`, so a cancel finishes it without freeing it, and it
 * is reaped when its task comes back.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/fr_err.h"
#include "common/fr_log.h"
#include "common/fr_util.h"
#include "coordinator/coord_impl.h"

#define COORD_PROMPT_THREADS 2

struct coord_prompt_task {
  coord_prompt_task_t *next;
  coord_job_t *job;        /* the loop's; the pool never reads it */
  char *text;              /* raw prompt (owned), or NULL for chat */
  size_t text_len;
  model_chat_msg_t *msgs;  /* (n_msgs) chat messages, strings owned */
  size_t n_msgs;
  char *vars;              /* the chat's template variables (JSON), owned, or NULL */
  int32_t *ids;            /* out: prompt ids (owned until taken) */
  size_t n_ids;
  int rc;                  /* out */
  char err[256];           /* out: the message when rc != 0 */
};

static void coord__task_free(coord_prompt_task_t *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n_msgs; i++)
    free((char *)t->msgs[i].role), free((char *)t->msgs[i].content), free((char *)t->msgs[i].json);
  free(t->msgs);
  free(t->vars);
  free(t->text);
  free(t->ids);
  free(t);
}

static void coord__tasks_free(coord_prompt_task_t *list) {
  while (list) {
    coord_prompt_task_t *t = list;
    list = t->next;
    coord__task_free(t);
  }
}

/* ---- the pool's threads ---------------------------------------------------------- */

static int coord__task_chat(const coord_prompts_t *p, coord_prompt_task_t *t) {
  model_chat_t chat = {.msgs = t->msgs, .n = t->n_msgs, .vars = t->vars};
  return model_chat_tokenize(p->tok, &chat, &t->ids, &t->n_ids);
}

static void coord__task_run(const coord_prompts_t *p, coord_prompt_task_t *t) {
  if (t->msgs) t->rc = coord__task_chat(p, t);
  else t->rc = model_tokenize(p->tok, t->text, t->text_len, true, true, &t->ids, &t->n_ids);
  if (t->rc) snprintf(t->err, sizeof t->err, "%s", fr_last_error());
}

static void *coord__prompts_thread(void *arg) {
  coord_prompts_t *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && !p->todo_head) pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) break;
    coord_prompt_task_t *t = p->todo_head;
    p->todo_head = t->next;
    if (!p->todo_head) p->todo_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    coord__task_run(p, t);
    pthread_mutex_lock(&p->mu);
    t->next = p->done_head;
    p->done_head = t;
    uint64_t one = 1;
    if (write(p->efd, &one, sizeof one) < 0) FR_LOGW("prompt pool: eventfd: %s", strerror(errno));
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* ---- the loop's side -------------------------------------------------------------- */

int coord__prompts_init(coord_t *c) {
  coord_prompts_t *p = &c->prompts;
  *p = (coord_prompts_t){.tok = c->tok, .efd = -1};
  p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->efd < 0) return fr_errorf(-errno, "eventfd: %s", strerror(errno));
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (; p->n_threads < COORD_PROMPT_THREADS; p->n_threads++) {
    int rc = pthread_create(&p->threads[p->n_threads], NULL, coord__prompts_thread, p);
    if (rc) return fr_errorf(-rc, "prompt pool: pthread_create: %s", strerror(rc));
  }
  return 0;
}

void coord__prompts_deinit(coord_t *c) {
  coord_prompts_t *p = &c->prompts;
  if (p->efd < 0) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  coord__tasks_free(p->todo_head); /* their jobs are freed with the others (coord__jobs_destroy) */
  coord__tasks_free(p->done_head);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  close(p->efd);
  p->efd = -1;
}

/* A task holding a copy of the submit's text or messages (the submit is
 * gone when the task runs). */
static coord_prompt_task_t *coord__task_new(coord_job_t *j, const proto_submit_t *s) {
  coord_prompt_task_t *t = fr_calloc(1, sizeof *t);
  t->job = j;
  if (s->n_messages == 0) {
    t->text = fr_malloc(s->prompt_len + 1);
    memcpy(t->text, s->prompt, s->prompt_len);
    t->text[s->prompt_len] = 0;
    t->text_len = s->prompt_len;
    return t;
  }
  t->msgs = fr_calloc(s->n_messages, sizeof *t->msgs);
  t->n_msgs = s->n_messages;
  for (uint32_t i = 0; i < s->n_messages; i++) {
    const proto_chat_msg_t *m = &s->messages[i];
    t->msgs[i] = (model_chat_msg_t){.role = fr_strdup(m->role), .content = fr_strndup(m->content, m->content_len),
                                    .json = m->json ? fr_strndup(m->json, m->json_len) : NULL};
  }
  const proto_chat_msg_t *m0 = &s->messages[0];
  t->vars = m0->vars ? fr_strndup(m0->vars, m0->vars_len) : NULL;
  return t; /* NULs in content end the text, as the template renders it */
}

void coord__prompts_submit(coord_t *c, coord_job_t *j, const proto_submit_t *s) {
  coord_prompts_t *p = &c->prompts;
  coord_prompt_task_t *t = coord__task_new(j, s);
  j->tokenizing = true;
  c->n_tokenizing++;
  pthread_mutex_lock(&p->mu);
  if (p->todo_tail) p->todo_tail->next = t;
  else p->todo_head = t;
  p->todo_tail = t;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void coord__prompts_on_ready(coord_t *c) {
  coord_prompts_t *p = &c->prompts;
  uint64_t n;
  if (read(p->efd, &n, sizeof n) < 0 && errno != EAGAIN) FR_LOGW("prompt pool: eventfd: %s", strerror(errno));
  pthread_mutex_lock(&p->mu);
  coord_prompt_task_t *done = NULL;
  for (coord_prompt_task_t *t = p->done_head, *next; t; t = next) /* oldest first */
    next = t->next, t->next = done, done = t;
  p->done_head = NULL;
  pthread_mutex_unlock(&p->mu);
  while (done) {
    coord_prompt_task_t *t = done;
    done = t->next;
    coord_job_t *j = t->job;
    j->tokenizing = false;
    c->n_tokenizing--;
    coord__job_prompt_ready(c, j, t->rc, t->err, t->ids, t->n_ids); /* takes the ids */
    t->ids = NULL;
    coord__task_free(t);
  }
}
