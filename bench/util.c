/* SPDX-License-Identifier: MIT */
/* Statistics, the machine, child processes, messages and the report. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

/* ---- time and statistics ------------------------------------------------------------- */

uint64_t now_ns(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
        double x = *(const double *)a, y = *(const double *)b;

        return x < y ? -1 : x > y;
}

void stats_of(double *v, size_t n, struct stats *ret)
{
        double sum = 0;
        size_t i99;

        memset(ret, 0, sizeof(*ret));
        if (n == 0)
                return;
        qsort(v, n, sizeof(*v), cmp_double);
        for (size_t i = 0; i < n; i++)
                sum += v[i];
        /* the nearest-rank percentile: the smallest sample with 99% at or below it */
        i99 = (size_t)ceil(0.99 * (double)n);
        ret->n = n;
        ret->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        ret->p99 = v[i99 ? i99 - 1 : 0];
        ret->min = v[0];
        ret->max = v[n - 1];
        ret->mean = sum / (double)n;
}

/* ---- the machine ---------------------------------------------------------------------- */

/* A number after "field:" in a /proc status-like file, or -1. */
static long status_field_kib(const char *path, const char *field)
{
        size_t flen = strlen(field);
        char line[256];
        long v = -1;
        FILE *f = fopen(path, "re");

        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f)) {
                if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
                        v = strtol(line + flen + 1, NULL, 10);
                        break;
                }
        }
        fclose(f);
        return v;
}

uint64_t mem_available(void)
{
        long kib = status_field_kib("/proc/meminfo", "MemAvailable");

        return kib > 0 ? (uint64_t)kib * KIB : 0;
}

long rss_kib(pid_t pid)
{
        char path[64];

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        return status_field_kib(path, "VmRSS");
}

long switches(pid_t pid)
{
        char path[64];

        if (pid <= 0)
                return -1;
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        long vol = status_field_kib(path, "voluntary_ctxt_switches");
        long invol = status_field_kib(path, "nonvoluntary_ctxt_switches");
        return vol < 0 || invol < 0 ? -1 : vol + invol;
}

uint64_t cpu_ns(pid_t pid)
{
        unsigned long long ns = 0;
        char path[64];
        FILE *f;

        if (pid <= 0)
                return 0;
        snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return 0;
        if (fscanf(f, "%llu", &ns) != 1)
                ns = 0;
        fclose(f);
        return ns;
}

/* Left for the rest of the machine (and the daemon's own growth) when we size memory. */
#define MEM_SPARE (512 * MIB)

bool fits(uint64_t size, uint64_t need, const char **why)
{
        uint64_t avail;

        if (size > opt.max_size) {
                *why = opt.quick ? "--quick" : "--max-size";
                return false;
        }
        avail = mem_available();
        if (avail && need + MEM_SPARE > avail) {
                *why = "MemAvailable";
                return false;
        }
        return true;
}

static int pin_cpus[2] = {-1, -1};
/* The CPUs we may run on when the run started: where an unpinned process goes. */
static cpu_set_t pin_all;
static bool pin_known;

void pin_init(void)
{
        int n = 0;

        if (sched_getaffinity(0, sizeof(pin_all), &pin_all) < 0) {
                opt.pin = PIN_NONE;
                opt.placements = 1u << PIN_NONE;
                return;
        }
        pin_known = true;
        for (int cpu = 0; cpu < CPU_SETSIZE && n < 2; cpu++)
                if (CPU_ISSET(cpu, &pin_all))
                        pin_cpus[n++] = cpu;
        if (n == 1 && opt.pin == PIN_SPLIT)
                opt.pin = PIN_SAME;
        /* one CPU has no split placement */
        if (n == 1 && (opt.placements & (1u << PIN_SPLIT)))
                opt.placements = (opt.placements & ~(1u << PIN_SPLIT)) | 1u << PIN_SAME;
        if (n == 0) {
                opt.pin = PIN_NONE;
                opt.placements = 1u << PIN_NONE;
        }
}

int pin_pid(pid_t pid, enum role role)
{
        cpu_set_t set;
        int cpu;

        if (!pin_known)
                return 0;
        if (opt.pin == PIN_NONE) {
                /* back to every CPU: a placement before this one may have pinned pid */
                set = pin_all;
        } else {
                cpu = opt.pin == PIN_SPLIT && role == ROLE_SERVER ? pin_cpus[1] : pin_cpus[0];
                CPU_ZERO(&set);
                CPU_SET(cpu, &set);
        }
        return sched_setaffinity(pid, sizeof(set), &set) < 0 ? -errno : 0;
}

int pin_self(enum role role)
{
        return pin_pid(0, role);
}

const char *pin_name(enum pin pin)
{
        static const char *const names[PIN_MODES] = {"same", "split", "none"};

        return names[pin];
}

const char *pin_describe(char *buf, size_t len)
{
        if (opt.pin == PIN_SPLIT)
                snprintf(buf, len, "clients on CPU %d, dlxd and echo servers on CPU %d",
                         pin_cpus[0], pin_cpus[1]);
        else if (opt.pin == PIN_SAME)
                snprintf(buf, len, "every process on CPU %d", pin_cpus[0]);
        else
                snprintf(buf, len, "not pinned");
        return buf;
}

const char *fmt_size(uint64_t b, char *buf, size_t len)
{
        if (b >= GIB && b % GIB == 0)
                snprintf(buf, len, "%llu GiB", (unsigned long long)(b / GIB));
        else if (b >= MIB && b % MIB == 0)
                snprintf(buf, len, "%llu MiB", (unsigned long long)(b / MIB));
        else if (b >= KIB && b % KIB == 0)
                snprintf(buf, len, "%llu KiB", (unsigned long long)(b / KIB));
        else
                snprintf(buf, len, "%llu B", (unsigned long long)b);
        return buf;
}

void *shm_alloc(size_t size)
{
        void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);

        return p == MAP_FAILED ? NULL : p;
}

void shm_free(void *p, size_t size)
{
        if (p)
                munmap(p, size ? size : 1);
}

/* ---- child processes ------------------------------------------------------------------------ */

#define MAX_CHILDREN 1024

/* The parent's view of its live children; read by the signal handler. */
static volatile sig_atomic_t nkids;
static volatile pid_t kids[MAX_CHILDREN];
static int kid_ctl[MAX_CHILDREN];
static bool kid_keep[MAX_CHILDREN];

void close_fd(int *fd)
{
        if (*fd >= 0)
                close(*fd);
        *fd = -1;
}

int pair(int sv[2])
{
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -errno;
        return 0;
}

static void kid_add(pid_t pid, int ctl, bool keep)
{
        int n = nkids;

        kids[n] = pid;
        kid_ctl[n] = ctl;
        kid_keep[n] = keep;
        nkids = n + 1;
}

static void kid_remove(pid_t pid)
{
        int n = nkids;

        for (int i = 0; i < n; i++) {
                if (kids[i] != pid)
                        continue;
                /* the last one moves here; the handler may read a duplicate, never a hole */
                kids[i] = kids[n - 1];
                kid_ctl[i] = kid_ctl[n - 1];
                kid_keep[i] = kid_keep[n - 1];
                nkids = n - 1;
                return;
        }
}

static int start(struct child *ch, const char *what, child_fn fn, void *arg, bool keep)
{
        pid_t parent = getpid();
        int sv[2], err;

        ch->pid = -1;
        ch->ctl = -1;
        ch->what = what;
        if (nkids >= MAX_CHILDREN)
                return -EAGAIN;
        err = pair(sv);
        if (err < 0)
                return err;
        fflush(NULL);
        ch->pid = fork();
        if (ch->pid < 0) {
                err = -errno;
                close(sv[0]);
                close(sv[1]);
                return err;
        }
        if (ch->pid == 0) {
                int rc;

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != parent)
                        _exit(1);
                signal(SIGINT, SIG_DFL);
                signal(SIGTERM, SIG_DFL);
                signal(SIGHUP, SIG_DFL);
                close(sv[0]);
                /* other children's control ends are the parent's, not ours */
                for (int i = 0; i < nkids; i++)
                        close(kid_ctl[i]);
                nkids = 0;
                rc = fn(sv[1], arg);
                fflush(NULL);
                _exit(rc & 0xff);
        }
        close(sv[1]);
        ch->ctl = sv[0];
        kid_add(ch->pid, ch->ctl, keep);
        return 0;
}

int child_start(struct child *ch, const char *what, child_fn fn, void *arg)
{
        return start(ch, what, fn, arg, false);
}

int child_start_keep(struct child *ch, const char *what, child_fn fn, void *arg)
{
        return start(ch, what, fn, arg, true);
}

static void sleep_us(long us)
{
        struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};

        nanosleep(&ts, NULL);
}

int child_wait(struct child *ch, int timeout_ms)
{
        uint64_t deadline = now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000u;
        long nap = 50;
        int status, rc;
        pid_t r;

        if (ch->pid <= 0)
                return 0;
        for (;;) {
                r = waitpid(ch->pid, &status, WNOHANG);
                if (r == ch->pid || (r < 0 && errno != EINTR))
                        break;
                if (timeout_ms >= 0 && now_ns() >= deadline) {
                        kill(ch->pid, SIGKILL);
                        while (waitpid(ch->pid, &status, 0) < 0 && errno == EINTR)
                                ;
                        r = -1;
                        errno = ETIMEDOUT;
                        break;
                }
                sleep_us(nap);
                if (nap < 5000)
                        nap *= 2;
        }
        if (r == ch->pid)
                rc = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
        else
                rc = errno == ETIMEDOUT ? -ETIMEDOUT : -ECHILD;
        kid_remove(ch->pid);
        ch->pid = -1;
        close_fd(&ch->ctl);
        return rc;
}

void child_kill(struct child *ch)
{
        if (ch->pid > 0)
                kill(ch->pid, SIGKILL);
        child_wait(ch, -1);
}

int child_done(struct child *ch, int timeout_ms, const char *scenario)
{
        const char *what = ch->what;
        int rc = child_wait(ch, timeout_ms);

        if (rc == 0)
                return 0;
        if (rc == -ETIMEDOUT)
                report_error(scenario, "%s did not finish in %d s", what, timeout_ms / 1000);
        else if (rc > 128)
                report_error(scenario, "%s died of signal %d", what, rc - 128);
        else
                report_error(scenario, "%s failed (exit status %d)", what, rc);
        return -1;
}

void children_kill_scenario(void)
{
        for (int i = 0; i < nkids;) {
                struct child ch = {.pid = kids[i], .ctl = kid_ctl[i]};
                if (kid_keep[i]) {
                        i++;
                        continue;
                }
                /* removes entry i: the next one moves into it */
                child_kill(&ch);
        }
}

void children_kill_all(void)
{
        int n = nkids, status;

        for (int i = 0; i < n; i++)
                kill(kids[i], SIGKILL);
        for (int i = 0; i < n; i++)
                while (waitpid(kids[i], &status, 0) < 0 && errno == EINTR)
                        ;
        nkids = 0;
}

int msg_send(int fd, uint64_t v)
{
        ssize_t n;

        do
                n = send(fd, &v, sizeof(v), MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == ECONNRESET ? -EPIPE : -errno;
        return n == sizeof(v) ? 0 : -EIO;
}

int msg_recv(int fd, uint64_t *v, int timeout_ms)
{
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        uint64_t deadline = now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000u;
        ssize_t n;
        int r;

        for (;;) {
                int left = -1;

                if (timeout_ms >= 0) {
                        uint64_t now = now_ns();
                        left = now >= deadline ? 0 : (int)((deadline - now) / 1000000u);
                }
                r = poll(&pfd, 1, left);
                if (r > 0)
                        break;
                if (r == 0)
                        return -ETIMEDOUT;
                if (errno != EINTR)
                        return -errno;
        }
        do
                n = recv(fd, v, sizeof(*v), MSG_WAITALL);
        while (n < 0 && errno == EINTR);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
                return -EPIPE;
        if (n < 0)
                return -errno;
        return n == sizeof(*v) ? 0 : -EPIPE;
}

/* ---- libdlx helpers ---------------------------------------------------------------------- */

int dlx_fail(const char *what, int err)
{
        const char *detail = dlx_last_error();

        fprintf(stderr, "dlx-bench: %s: %s%s%s%s\n", what, dlx_strerror(err), detail[0] ? " (" : "",
                detail, detail[0] ? ")" : "");
        return -1;
}

dlx_client *bench_connect(const char *client_name)
{
        struct dlx_connect_options o = {.socket_path = opt.socket, .client_name = client_name};
        dlx_client *c = NULL;
        int err = dlx_connect(&o, &c);

        if (err < 0) {
                char what[96];
                snprintf(what, sizeof(what), "%s: connect to %s", client_name, opt.socket);
                dlx_fail(what, err);
                return NULL;
        }
        return c;
}

void proto_u8(DLTensor *t, int64_t *shape, uint64_t bytes, DLDevice device)
{
        memset(t, 0, sizeof(*t));
        shape[0] = (int64_t)bytes;
        t->device = device;
        t->ndim = 1;
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->shape = shape;
}

struct view {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        free(t->manager_ctx);
}

DLManagedTensorVersioned *view_new(void *data, uint64_t bytes, DLDevice device)
{
        struct view *v = calloc(1, sizeof(*v));

        if (!v)
                return NULL;
        v->mt.version.major = DLX_DLPACK_MAJOR;
        v->mt.version.minor = DLX_DLPACK_MINOR;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        proto_u8(&v->mt.dl_tensor, v->shape, bytes, device);
        v->mt.dl_tensor.data = data;
        return &v->mt;
}

void bench_name(char *buf, size_t len, const char *fmt, ...)
{
        char tail[192];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(tail, sizeof(tail), fmt, ap);
        va_end(ap);
        snprintf(buf, len, "%s/%s", opt.prefix, tail);
}

/* ---- reporting ------------------------------------------------------------------------------ */

#define MAX_ROWS 256
#define MAX_TARGETS 16
#define MAX_NOTES 64

struct target {
        char key[48];
        char what[96];
        double value;
        bool at_most;
        double limit;
        const char *unit;
        bool met;
};

struct note {
        char scenario[16];
        char what[64];
        char why[160];
};

static struct row rows[MAX_ROWS];
static int nrows;
static struct target targets[MAX_TARGETS];
static int ntargets;
static struct note skips[MAX_NOTES], errors[MAX_NOTES];
static int nskips, nerrors, nfailures;

static const char *fmt_ns(double ns, char *buf, size_t len)
{
        if (ns < 1e3)
                snprintf(buf, len, "%.0f ns", ns);
        else if (ns < 1e6)
                snprintf(buf, len, "%.1f us", ns / 1e3);
        else if (ns < 1e9)
                snprintf(buf, len, "%.1f ms", ns / 1e6);
        else
                snprintf(buf, len, "%.2f s", ns / 1e9);
        return buf;
}

static const char *fmt_value(double v, const char *unit, char *buf, size_t len)
{
        if (v >= 1e7)
                snprintf(buf, len, "%.3g %s", v, unit);
        else if (v >= 100)
                snprintf(buf, len, "%.0f %s", v, unit);
        else if (v >= 10)
                snprintf(buf, len, "%.1f %s", v, unit);
        else
                snprintf(buf, len, "%.2f %s", v, unit);
        return buf;
}

void report_heading(const char *scenario, const char *text)
{
        if (opt.json)
                return;
        printf("\n%-8s  %s\n", scenario, text);
        fflush(stdout);
}

void report_row(const struct row *r)
{
        char med[24] = "", p99[24] = "", min[24] = "", val[32] = "", ratio[32] = "", cpu[64] = "";
        char cc[24], cs[24];

        if (nrows < MAX_ROWS)
                rows[nrows++] = *r;
        if (opt.json)
                return;
        if (r->has_stats) {
                fmt_ns(r->st.median, med, sizeof(med));
                fmt_ns(r->st.p99, p99, sizeof(p99));
                fmt_ns(r->st.min, min, sizeof(min));
        }
        if (r->has_value)
                fmt_value(r->value, r->unit, val, sizeof(val));
        if (r->has_ratio)
                snprintf(ratio, sizeof(ratio), "%.2fx %s", r->ratio, r->ratio_to);
        if (r->has_cpu)
                snprintf(cpu, sizeof(cpu), "  cpu %s + %s", fmt_ns(r->cpu_client, cc, sizeof(cc)),
                         fmt_ns(r->cpu_server, cs, sizeof(cs)));
        printf("%-8s  %-34s %10s %10s %10s %15s  %s%s\n", r->placement ? r->placement : r->scenario,
               r->label, med, p99, min, val, ratio, cpu);
        fflush(stdout);
}

double latency_row(const struct latency *l, struct stats *ret)
{
        struct row r = {.scenario = l->scenario, .has_stats = true, .placement = l->placement};

        if (l->wakes >= 0) {
                r.has_value = true;
                r.value = l->wakes;
                r.unit = "dlxd csw";
        }
        if (l->cpu && l->cpu->ops) {
                r.has_cpu = true;
                r.cpu_client = (double)l->cpu->client / (double)l->cpu->ops;
                r.cpu_server = (double)l->cpu->server / (double)l->cpu->ops;
        }
        stats_of(l->v, l->n, &r.st);
        snprintf(r.key, sizeof(r.key), "%s", l->key);
        snprintf(r.label, sizeof(r.label), "%s", l->label);
        if (l->floor) {
                struct stats f;
                stats_of(l->floor, l->n, &f);
                r.has_ratio = true;
                r.ratio = r.st.median / f.median;
                r.ratio_to = l->floor_name;
                r.floor_median = f.median;
        }
        report_row(&r);
        if (ret)
                *ret = r.st;
        return r.has_ratio ? r.ratio : 0;
}

void report_value(const char *scenario, const char *key, const char *label, double value,
                  const char *unit, double ratio, const char *ratio_to)
{
        struct row row = {.scenario = scenario, .has_value = true, .value = value, .unit = unit};

        snprintf(row.key, sizeof(row.key), "%s", key);
        snprintf(row.label, sizeof(row.label), "%s", label);
        if (ratio > 0) {
                row.has_ratio = true;
                row.ratio = ratio;
                row.ratio_to = ratio_to;
        }
        report_row(&row);
}

void report_target(const char *key, const char *what, double value, bool at_most, double limit,
                   const char *unit)
{
        struct target *t;

        if (ntargets >= MAX_TARGETS)
                return;
        t = &targets[ntargets++];
        snprintf(t->key, sizeof(t->key), "%s", key);
        snprintf(t->what, sizeof(t->what), "%s", what);
        t->value = value;
        t->at_most = at_most;
        t->limit = limit;
        t->unit = unit;
        t->met = at_most ? value <= limit : value >= limit;
}

static void note_add(struct note *list, int *n, const char *scenario, const char *what,
                     const char *why)
{
        if (*n >= MAX_NOTES)
                return;
        snprintf(list[*n].scenario, sizeof(list[*n].scenario), "%s", scenario);
        snprintf(list[*n].what, sizeof(list[*n].what), "%s", what);
        snprintf(list[*n].why, sizeof(list[*n].why), "%s", why);
        (*n)++;
}

void report_skip(const char *scenario, const char *what, const char *why)
{
        note_add(skips, &nskips, scenario, what, why);
        if (!what[0])
                fprintf(opt.json ? stderr : stdout, "%s: skipped (%s)\n", scenario, why);
        else if (opt.json)
                fprintf(stderr, "%s: %s skipped (%s)\n", scenario, what, why);
        else
                printf("%-8s  %-34s skipped (%s)\n", scenario, what, why);
        fflush(stdout);
}

void report_error(const char *scenario, const char *fmt, ...)
{
        char msg[160];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        note_add(errors, &nerrors, scenario, "", msg);
        nfailures++;
        fflush(stdout);
        fprintf(stderr, "dlx-bench: %s: error: %s\n", scenario, msg);
}

/* JSON strings here are our own ASCII labels and daemon messages: escape what JSON needs. */
static void json_str(const char *s)
{
        putchar('"');
        for (; *s; s++) {
                unsigned char ch = (unsigned char)*s;
                if (ch == '"' || ch == '\\')
                        printf("\\%c", ch);
                else if (ch < 0x20)
                        printf("\\u%04x", ch);
                else
                        putchar(ch);
        }
        putchar('"');
}

static void json_num(double v)
{
        if (isfinite(v))
                printf("%.6g", v);
        else
                printf("null");
}

static void json_notes(const char *name, const struct note *list, int n)
{
        printf(",\n  \"%s\": [", name);
        for (int i = 0; i < n; i++) {
                printf("%s\n    {\"scenario\": ", i ? "," : "");
                json_str(list[i].scenario);
                if (list[i].what[0]) {
                        printf(", \"what\": ");
                        json_str(list[i].what);
                }
                printf(", \"why\": ");
                json_str(list[i].why);
                printf("}");
        }
        printf("%s]", n ? "\n  " : "");
}

static void finish_json(void)
{
        printf("{\n  \"bench\": \"dlx-bench\",\n  \"version\": \"%s\",\n  \"server\": ",
               DLX_VERSION);
        json_str(opt.server);
        printf(",\n  \"cpus\": %ld,\n  \"mem_available\": %llu,\n  \"quick\": %s,\n"
               "  \"iterations\": %ld,\n  \"duration_s\": ",
               sysconf(_SC_NPROCESSORS_ONLN), (unsigned long long)mem_available(),
               opt.quick ? "true" : "false", opt.iterations);
        json_num(opt.duration);
        printf(",\n  \"max_size\": %llu,\n  \"results\": [", (unsigned long long)opt.max_size);
        for (int i = 0; i < nrows; i++) {
                const struct row *r = &rows[i];
                printf("%s\n    {\"scenario\": \"%s\", \"key\": ", i ? "," : "", r->scenario);
                json_str(r->key);
                printf(", \"label\": ");
                json_str(r->label);
                if (r->has_stats) {
                        printf(", \"n\": %zu, \"median_ns\": ", r->st.n);
                        json_num(r->st.median);
                        printf(", \"p99_ns\": ");
                        json_num(r->st.p99);
                        printf(", \"min_ns\": ");
                        json_num(r->st.min);
                }
                if (r->has_value) {
                        printf(", \"value\": ");
                        json_num(r->value);
                        printf(", \"unit\": ");
                        json_str(r->unit);
                }
                if (r->has_ratio) {
                        printf(", \"ratio\": ");
                        json_num(r->ratio);
                        printf(", \"ratio_to\": ");
                        json_str(r->ratio_to);
                }
                if (r->floor_median > 0) {
                        printf(", \"floor_median_ns\": ");
                        json_num(r->floor_median);
                }
                if (r->placement)
                        printf(", \"placement\": \"%s\"", r->placement);
                if (r->has_cpu) {
                        printf(", \"cpu_client_ns\": ");
                        json_num(r->cpu_client);
                        printf(", \"cpu_server_ns\": ");
                        json_num(r->cpu_server);
                }
                printf("}");
        }
        printf("%s],\n  \"targets\": [", nrows ? "\n  " : "");
        for (int i = 0; i < ntargets; i++) {
                const struct target *t = &targets[i];
                printf("%s\n    {\"key\": ", i ? "," : "");
                json_str(t->key);
                printf(", \"what\": ");
                json_str(t->what);
                printf(", \"value\": ");
                json_num(t->value);
                printf(", \"op\": \"%s\", \"limit\": ", t->at_most ? "<=" : ">=");
                json_num(t->limit);
                printf(", \"unit\": ");
                json_str(t->unit);
                printf(", \"met\": %s}", t->met ? "true" : "false");
        }
        printf("%s]", ntargets ? "\n  " : "");
        json_notes("skipped", skips, nskips);
        json_notes("errors", errors, nerrors);
        printf(",\n  \"ok\": %s\n}\n", nfailures ? "false" : "true");
}

int report_finish(void)
{
        if (opt.json) {
                finish_json();
                fflush(stdout);
                return nfailures;
        }
        if (ntargets) {
                printf("\ntargets (a miss is reported, never a failure)\n");
                for (int i = 0; i < ntargets; i++) {
                        const struct target *t = &targets[i];
                        char val[32];
                        if (t->unit[0] == 'x')
                                snprintf(val, sizeof(val), "%.2fx", t->value);
                        else
                                fmt_value(t->value, t->unit, val, sizeof(val));
                        printf("  %-60s %12s  %s\n", t->what, val, t->met ? "met" : "MISSED");
                }
        }
        /* the errors again, last, where a reader of only the end of the output sees them */
        if (nfailures)
                printf("\n%d error%s:\n", nfailures, nfailures == 1 ? "" : "s");
        for (int i = 0; i < nerrors; i++)
                printf("  %s: %s\n", errors[i].scenario, errors[i].why);
        fflush(stdout);
        return nfailures;
}
