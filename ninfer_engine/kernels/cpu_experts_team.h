// The spinning team that runs the worker's jobs (included by cpu_experts.c).
//
// A decode step posts a job each offloaded layer, a few hundred µs apart. An OpenMP team
// there spends most of a small job waking: torch's libgomp is the process's, and once its
// threads outnumber the cores (torch's own team and this one) a waiting thread spins ~100
// times and then sleeps on a futex, so each of the job's three joins (start, the barrier
// between the projections, the end) waits for threads to be woken. These threads instead spin
// on the task counter for TEAM_SPIN_S after their last task, then sleep on a condition
// variable until the next one. One team per process, of the size the last job asked for; jobs
// run one at a time (`TEAM_LOCK`).
#include <sched.h>
#include <stdatomic.h>

#define TEAM_SPIN_S 0.02

// A spin-wait's step: a pause, or past a few thousand of them a yield (more threads than
// cores, where the awaited thread may need this one's core)
static inline void spin_wait(int *spins) {
    if (++*spins < 4096) {
        _mm_pause();
    } else {
        sched_yield();
    }
}

typedef struct spin_team {
    int n;                       // threads, the caller's included
    pthread_t *helpers;          // n - 1
    pthread_mutex_t lock;        // with `wake`: sleeping helpers
    pthread_cond_t wake;
    int sleeping, stop;          // under `lock`
    _Atomic int64_t task;        // one more per task
    _Atomic int done;            // helpers through the current task
    _Atomic int arrived;         // at the barrier between the phases
    _Atomic int64_t passed;      // barriers passed
    const experts_args *args;    // the current task
    experts_form form;
} spin_team;

typedef struct {
    spin_team *team;
    int index;
} team_seat;

static spin_team *TEAM;
static pthread_mutex_t TEAM_LOCK = PTHREAD_MUTEX_INITIALIZER;

static void team_barrier(spin_team *T) {
    const int64_t passed = atomic_load_explicit(&T->passed, memory_order_acquire);
    if (atomic_fetch_add_explicit(&T->arrived, 1, memory_order_acq_rel) == T->n - 1) {
        atomic_store_explicit(&T->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&T->passed, 1, memory_order_release);
    } else {
        int spins = 0;
        while (atomic_load_explicit(&T->passed, memory_order_acquire) == passed)
            spin_wait(&spins);
    }
}

static void team_part(spin_team *T, int t) {
    const experts_args *a = T->args;
    const int64_t n1 = a->pairs * a->I, n2 = a->H, n = T->n;
    T->form.gate_up(a, n1 * t / n, n1 * (t + 1) / n);
    team_barrier(T);
    T->form.down(a, n2 * t / n, n2 * (t + 1) / n);
}

static void *team_helper(void *arg) {
    team_seat seat = *(team_seat *)arg;
    free(arg);
    spin_team *T = seat.team;
    int64_t seen = 0;
    int spins = 0;
    double idle_since = omp_get_wtime();
    for (;;) {
        const int64_t task = atomic_load_explicit(&T->task, memory_order_acquire);
        if (task != seen) {
            seen = task;
            if (T->stop) break;  // (written before the task count that woke this thread)
            team_part(T, seat.index);
            atomic_fetch_add_explicit(&T->done, 1, memory_order_release);
            idle_since = omp_get_wtime();
            spins = 0;
        } else if (omp_get_wtime() - idle_since > TEAM_SPIN_S) {
            pthread_mutex_lock(&T->lock);
            T->sleeping++;
            while (atomic_load_explicit(&T->task, memory_order_acquire) == seen)
                pthread_cond_wait(&T->wake, &T->lock);
            T->sleeping--;
            pthread_mutex_unlock(&T->lock);
            idle_since = omp_get_wtime();
        } else {
            spin_wait(&spins);
        }
    }
    return NULL;
}

// Bump the task count (waking the sleepers): the helpers start on T->args / T->form
static void team_post(spin_team *T) {
    pthread_mutex_lock(&T->lock);
    atomic_fetch_add_explicit(&T->task, 1, memory_order_release);
    if (T->sleeping) pthread_cond_broadcast(&T->wake);
    pthread_mutex_unlock(&T->lock);
}

static void team_free(spin_team *T) {
    pthread_mutex_lock(&T->lock);
    T->stop = 1;
    pthread_mutex_unlock(&T->lock);
    team_post(T);
    for (int i = 0; i < T->n - 1; i++) pthread_join(T->helpers[i], NULL);
    free(T->helpers);
    free(T);
}

// A team of n threads (n - 1 helpers), or NULL where a thread could not start
static spin_team *team_new(int n) {
    spin_team *T = calloc(1, sizeof *T);
    if (!T) return NULL;
    T->helpers = calloc((size_t)n, sizeof *T->helpers);
    pthread_mutex_init(&T->lock, NULL);
    pthread_cond_init(&T->wake, NULL);
    for (T->n = 1; T->helpers && T->n < n; T->n++) {
        team_seat *seat = malloc(sizeof *seat);
        if (!seat) break;
        *seat = (team_seat){T, T->n};
        if (pthread_create(&T->helpers[T->n - 1], NULL, team_helper, seat)) {
            free(seat);
            break;
        }
    }
    if (T->n < n || !T->helpers) {
        team_free(T);
        return NULL;
    }
    return T;
}

// A forked child has none of the parent's helper threads: it starts its own team
static void team_forget(void) {
    TEAM = NULL;
    pthread_mutex_init(&TEAM_LOCK, NULL);
}

__attribute__((constructor)) static void team_atfork(void) {
    pthread_atfork(NULL, NULL, team_forget);
}

// Both phases of `form` over `a` on a team of `n` threads, this one among them; 0 where the
// helper threads could not start (the caller runs it another way)
static int team_run(const experts_args *a, experts_form form, int n) {
    pthread_mutex_lock(&TEAM_LOCK);
    if (TEAM && TEAM->n != n) {
        team_free(TEAM);
        TEAM = NULL;
    }
    if (!TEAM) TEAM = team_new(n);
    spin_team *T = TEAM;
    if (T) {
        T->args = a;
        T->form = form;
        atomic_store_explicit(&T->done, 0, memory_order_relaxed);
        team_post(T);
        team_part(T, 0);
        int spins = 0;
        while (atomic_load_explicit(&T->done, memory_order_acquire) < T->n - 1)
            spin_wait(&spins);
    }
    pthread_mutex_unlock(&TEAM_LOCK);
    return T != NULL;
}
