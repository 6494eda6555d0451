/* test_jinja.c - the Jinja interpreter's pieces (model/jinja.h): whitespace
 * control, expressions, statements, filters, tests and methods against what
 * jinja2 gives (as transformers configures it), and its limits: deep
 * nesting, huge loops, runaway output, recursion and syntax errors end
 * with an error, never a hang or a crash. */
#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/fr_err.h"
#include "model/jinja.h"

/* Renders src with the JSON variables vars (NULL: none) and lim; returns
 * the rc, *out the text (or the error message), owned by a static. */
static int render_lim(const char *src, const char *vars, const model_jinja_limits_t *lim, const char **out) {
  static char *last;
  free(last);
  last = NULL;
  model_jinja_t *t = NULL;
  json_t *v = vars ? json_loads(vars, 0, NULL) : NULL;
  int rc = model_jinja_parse(&t, src, strlen(src));
  if (!rc) rc = model_jinja_render(t, v, lim, &last, NULL);
  if (rc) last = strdup(fr_last_error());
  model_jinja_destroy(t);
  json_decref(v);
  *out = last;
  return rc;
}

static void expect(const char *src, const char *vars, const char *want) {
  const char *got;
  int rc = render_lim(src, vars, NULL, &got);
  ck_assert_msg(rc == 0, "%s: error %s", src, got);
  ck_assert_msg(!strcmp(got, want), "%s:\n  want \"%s\"\n  got  \"%s\"", src, want, got);
}

static void expect_error(const char *src, const char *vars, int code, const char *msg_part) {
  const char *got;
  int rc = render_lim(src, vars, NULL, &got);
  ck_assert_msg(rc == code, "%s: rc %d (want %d): %s", src, rc, code, got ? got : "");
  ck_assert_msg(strstr(got, msg_part), "%s: message \"%s\" lacks \"%s\"", src, got, msg_part);
}

START_TEST(whitespace_control) {
  expect("a  {{- ' b ' -}}  c", NULL, "a b c");
  expect("{% if true %}\n  x\n{% endif %}\ny", NULL, "  x\ny");       /* trim_blocks */
  expect("<\n    {% if true %}x{% endif %}\n>", NULL, "<\nx>");      /* lstrip_blocks, trim_blocks */
  expect("a {%+ if true %}x{% endif %}", NULL, "a x");
  expect("{# note #}\nz\n", NULL, "z");                               /* comment's newline; trailing newline */
  expect("x{{ 1 }}\n{{ 2 }}", NULL, "x1\n2");                         /* no trimming after }} */
  expect("{%- if true -%}\n\n  a  \n{%- endif %}", NULL, "a");
}
END_TEST

START_TEST(expressions) {
  expect("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 / 2 }}", NULL, "7 3 -4 1 1024 0.5");
  expect("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}", NULL, "a1None abab [1, 2]");
  expect("{{ 1 < 2 and not 2 < 1 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }}", NULL, "True True True");
  expect("{{ 'y' if x else 'n' }}{{ 'z' if false }}", "{\"x\": 0}", "n");
  expect("{{ d.a }}{{ d['b'][1] }}{{ l[-1] }}{{ l[1:] }}{{ 'hello'[::-1] }}", "{\"d\": {\"a\": 1, \"b\": [5, 6]}, \"l\": [1, 2, 3]}",
         "163[2, 3]olleh");
  expect("{{ {'k': 'v', 'n': [1.5, true, none]} }}", NULL, "{'k': 'v', 'n': [1.5, True, None]}");
  expect("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 3.0 }} {{ 1e-5 }}", NULL, "1e+20 0.30000000000000004 3.0 1e-05");
  expect("{{ \"it's\" }} {{ ['it\\'s'] }}", NULL, "it's [\"it's\"]");
  expect("{{ missing }}|{{ missing is defined }}|{{ none is none }}", NULL, "|False|True");
}
END_TEST

START_TEST(statements) {
  expect("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}{{ x }}{{ ',' if not loop.last }}{% endfor %}", NULL, "11,23");
  expect("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
  expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;");
  expect("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
         NULL, "02");
  expect("{% set ns = namespace(n=0) %}{% for x in range(4) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", NULL, "6");
  expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1"); /* loops are scopes */
  expect("{% set b %}in {{ 1 }}{% endset %}[{{ b }}]", NULL, "[in 1]");
  expect("{% macro m(a, b='d') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(2, b=3) }}", NULL, "1-d 2-3");
  expect("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}body{% endcall %}", NULL, "<body>");
  expect("{% filter upper %}abc{% endfilter %}", NULL, "ABC");
  expect("{% if a %}1{% elif b %}2{% else %}3{% endif %}", "{\"a\": false, \"b\": true}", "2");
}
END_TEST

START_TEST(filters_tests_methods) {
  expect("{{ {'a': 'é', 'b': [1, 2.5]}|tojson }}|{{ [1]|tojson(indent=2) }}", NULL, "{\"a\": \"é\", \"b\": [1, 2.5]}|[\n  1\n]");
  expect("{{ ' x '|trim }}{{ 'ab'|length }}{{ 'ab'|upper }}{{ 'hello world'|title }}{{ 'aB'|capitalize }}", NULL,
         "x2ABHello WorldAb");
  expect("{{ missing|default('d') }}{{ ''|default('e', true) }}{{ [1, 2]|join(',') }}{{ [3, 4]|first }}{{ [3, 4]|last }}",
         NULL, "de1,234");
  expect("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join }}{{ ms|rejectattr('role', 'eq', 'user')|list|length }}",
         "{\"ms\": [{\"role\": \"user\", \"c\": \"u\"}, {\"role\": \"x\", \"c\": \"s\"}]}", "u1");
  expect("{{ '12'|int + 1 }}{{ 5|string ~ '' }}{{ 'a\\nb'|indent(2) }}{{ 'abc'|replace('b', 'x') }}", NULL, "135a\n  baxc");
  expect("{{ x is string }}{{ x is mapping }}{{ [1] is iterable }}{{ 1 is number }}{{ true is boolean }}{{ {} is sequence }}",
         "{\"x\": \"s\"}", "TrueFalseTrueTrueTrueTrue");
  expect("{{ ' ab '.strip() }}{{ 'a,b'.split(',') }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}", NULL,
         "ab['a', 'b']TrueTrue");
  expect("{{ 2 is even }}{{ 3 is odd }}{{ [1, 2.5]|sum }}{{ 2.567|round(2) }}{{ 2.5|round }}{{ 2.1|round(method='ceil') }}"
         "{{ d|attr('a') }}{{ [{'n': 1}, {'n': 2}]|sum(attribute='n') }}", "{\"d\": {\"a\": 1}}", "TrueTrue3.52.572.03.03");
  expect("{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'c']|sort(reverse=true) }}{{ {'b': 1, 'a': 2}|dictsort }}{{ [3, 1]|min }}{{ ['a', 'B']|max }}",
         NULL, "[1, 2, 3]['c', 'b', 'A'][('a', 2), ('b', 1)]1B");
  expect("{{ '{} and {name}'.format(1, name='x') }}|{{ ('<' | safe) + '<' }}|{{ [1]|map('string')|list }}", NULL, "1 and x|<&lt;|['1']");
  expect("{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.keys()|list }}{{ d.values()|list }}", "{\"d\": {\"a\": 1}}", "19['a'][1]");
}
END_TEST

START_TEST(errors_are_values) {
  expect_error("{{ raise_exception('no system role') }}", NULL, FR_EFORMAT, "no system role");
  expect_error("{% if %}", NULL, FR_EFORMAT, "syntax error");
  expect_error("{% for x in y %}", NULL, FR_EFORMAT, "missing an end tag");
  expect_error("{{ nope() }}", NULL, FR_EFORMAT, "'nope' is undefined");
  expect_error("{{ missing.attr }}", NULL, FR_EFORMAT, "undefined");
  expect_error("{{ 1 + 'a' }}", NULL, FR_EFORMAT, "unsupported operand");
  expect_error("{{ 'x'|nofilter }}", NULL, FR_EFORMAT, "no filter named");
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, FR_EFORMAT, "non-namespace");
  expect_error("{{ 'unclosed }}", NULL, FR_EFORMAT, "unclosed string");
}
END_TEST

START_TEST(limits) {
  const char *got;
  /* a huge loop stops at the step cap */
  model_jinja_limits_t lim = {.max_steps = 100000};
  ck_assert_int_eq(render_lim("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", NULL,
                              &lim, &got), FR_ETOOBIG);
  /* output cap */
  lim = (model_jinja_limits_t){.max_output = 1000};
  ck_assert_int_eq(render_lim("{% for i in range(10000) %}xxxxxxxxxx{% endfor %}", NULL, &lim, &got), FR_ETOOBIG);
  ck_assert_ptr_nonnull(strstr(got, "output"));
  /* unbounded macro recursion */
  ck_assert_int_eq(render_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &got), FR_ETOOBIG);
  /* memory: a string doubling in a loop */
  lim = (model_jinja_limits_t){.max_memory = 8u << 20};
  ck_assert_int_eq(render_lim("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                              NULL, &lim, &got), FR_ETOOBIG);
  /* deep nesting in the source is a syntax error, not a stack overflow */
  char *deep = malloc(200000);
  size_t n = 0;
  n += (size_t)sprintf(deep + n, "{{ ");
  for (int i = 0; i < 50000; i++) deep[n++] = '(';
  deep[n++] = '1';
  for (int i = 0; i < 50000; i++) deep[n++] = ')';
  strcpy(deep + n, " }}");
  ck_assert_int_eq(render_lim(deep, NULL, NULL, &got), FR_EFORMAT);
  n = 0;
  for (int i = 0; i < 19000; i++) n += (size_t)sprintf(deep + n, "{%% if 1 %%}");
  ck_assert_int_eq(render_lim(deep, NULL, NULL, &got), FR_EFORMAT);
  free(deep);
  /* a list nested a million deep (built in a loop) is compared and printed without a stack overflow */
  lim = (model_jinja_limits_t){.max_steps = 50000000};
  ck_assert_int_eq(render_lim("{% set ns = namespace(x=[]) %}{% for i in range(1000000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                              "{{ ns.x == ns.x }}{{ ns.x }}", NULL, &lim, &got), FR_ETOOBIG);
  ck_assert_msg(strstr(got, "nests deeper") || strstr(got, "memory"), "%s", got);
  /* a variable object of 200000 keys: loaded in linear time, and each lookup costs steps */
  char *big = malloc(200000 * 32 + 16);
  n = (size_t)sprintf(big, "{");
  for (int i = 0; i < 200000; i++) n += (size_t)sprintf(big + n, "%s\"k%d\": %d", i ? ", " : "", i, i);
  strcpy(big + n, "}");
  lim = (model_jinja_limits_t){.max_steps = 1000000};
  ck_assert_int_eq(render_lim("{{ k199999 }}", big, &lim, &got), 0);
  ck_assert_str_eq(got, "199999");
  ck_assert_int_eq(render_lim("{% for i in range(100000) %}{{ k199999 }}{% endfor %}", big, &lim, &got), FR_ETOOBIG);
  free(big);
  /* the repetition operator cannot make a huge string */
  ck_assert_int_eq(render_lim("{{ 'x' * 10000000000 }}", NULL, NULL, &got), FR_ETOOBIG);
}
END_TEST

/* The shared main (tests/common/test_main.c) runs this program's suites. */
#include "tests/common/test_main.h"

static Suite *jinja_suite(void) {
  Suite *s = suite_create("jinja");
  TCase *tc = tcase_create("jinja");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, whitespace_control);
  tcase_add_test(tc, expressions);
  tcase_add_test(tc, statements);
  tcase_add_test(tc, filters_tests_methods);
  tcase_add_test(tc, errors_are_values);
  tcase_add_test(tc, limits);
  suite_add_tcase(s, tc);
  return s;
}

const test_prog_t test_prog = {.suites = {jinja_suite}};
