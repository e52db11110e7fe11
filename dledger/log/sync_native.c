/* A flush round's fdatasyncs on a thread of its own that never takes the GIL.

A flush round (dledger/log/durability.py FlushTicket) fdatasyncs a few duplicated
descriptors, advises the kernel to drop some page-cache runs, and closes the duplicates. In
one of trio's worker threads that costs the loop thread more than the syscalls do: the worker
takes the GIL after it wakes, around each os.fdatasync and to hand its result back, and under
SYNC_FLUSH there is a round per append on every replica. A `Syncer` does the same work on a
plain POSIX thread: `submit` hands it a round, the thread writes to an eventfd when the round
is done, and the loop, woken by that descriptor, takes the outcome with `collect`. Rounds
that also fsync directories stay with the Python path (they are rare: a segment created or
removed).

One round at a time: `submit` while a round is in flight or not yet collected raises. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct {
    int fd;
    long long offset;
    long long length;
} Run;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int thread_started;
    int stopping;
    int event_fd;
    /* the round: set by submit, owned by the thread from `pending` until `done` */
    int *fds;
    Py_ssize_t nfds;
    Run *runs;
    Py_ssize_t nruns;
    int pending;  /* submitted, not yet taken by the thread */
    int busy;     /* submitted and not yet collected */
    int done;     /* the thread finished it */
    int error;    /* errno of the failed fdatasync, 0 when all succeeded */
} Syncer;

static void run_round(Syncer *self) {
    int error = 0;
    for (Py_ssize_t i = 0; i < self->nfds; i++) {
        if (fdatasync(self->fds[i]) != 0) {
            error = errno;
            break;
        }
    }
    if (error == 0) {  /* advice only: a failure loses nothing */
        for (Py_ssize_t i = 0; i < self->nruns; i++) {
            (void)posix_fadvise(self->runs[i].fd, (off_t)self->runs[i].offset,
                                (off_t)self->runs[i].length, POSIX_FADV_DONTNEED);
        }
    }
    for (Py_ssize_t i = 0; i < self->nfds; i++) {
        close(self->fds[i]);
    }
    for (Py_ssize_t i = 0; i < self->nruns; i++) {
        close(self->runs[i].fd);
    }
    self->error = error;
}

static void *worker(void *arg) {
    Syncer *self = (Syncer *)arg;
    pthread_mutex_lock(&self->mu);
    for (;;) {
        while (!self->pending && !self->stopping) {
            pthread_cond_wait(&self->cv, &self->mu);
        }
        if (!self->pending) {
            break; /* stopping, nothing left to run */
        }
        self->pending = 0;
        pthread_mutex_unlock(&self->mu);
        run_round(self);
        pthread_mutex_lock(&self->mu);
        self->done = 1;
        uint64_t one = 1;
        ssize_t wrote;
        do {
            wrote = write(self->event_fd, &one, sizeof one);
        } while (wrote < 0 && errno == EINTR);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

static void free_round(Syncer *self) {
    free(self->fds);
    free(self->runs);
    self->fds = NULL;
    self->runs = NULL;
    self->nfds = self->nruns = 0;
}

static void stop(Syncer *self) {
    if (self->thread_started) {
        pthread_mutex_lock(&self->mu);
        self->stopping = 1;
        pthread_cond_signal(&self->cv);
        pthread_mutex_unlock(&self->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL); /* a pending round runs to its end first */
        Py_END_ALLOW_THREADS
        self->thread_started = 0;
    }
    if (self->event_fd >= 0) {
        close(self->event_fd);
        self->event_fd = -1;
    }
}

static int Syncer_init(Syncer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Syncer", kwlist)) {
        return -1;
    }
    if (self->thread_started || self->event_fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a Syncer is initialised once");
        return -1;
    }
    self->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->event_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    int err = pthread_create(&self->thread, NULL, worker, self);
    if (err != 0) {
        close(self->event_fd);
        self->event_fd = -1;
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->thread_started = 1;
    return 0;
}

static PyObject *Syncer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    Syncer *self = (Syncer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->event_fd = -1;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    return (PyObject *)self;
}

static void Syncer_dealloc(Syncer *self) {
    stop(self);
    free_round(self);
    pthread_cond_destroy(&self->cv);
    pthread_mutex_destroy(&self->mu);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int read_fd(PyObject *item, int *out) {
    long value = PyLong_AsLong(item);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value < 0 || value > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", value);
        return -1;
    }
    *out = (int)value;
    return 0;
}

static PyObject *Syncer_submit(Syncer *self, PyObject *args) {
    PyObject *fds_arg, *runs_arg;
    if (!PyArg_ParseTuple(args, "OO:submit", &fds_arg, &runs_arg)) {
        return NULL;
    }
    if (!self->thread_started) {
        PyErr_SetString(PyExc_RuntimeError, "the Syncer is closed");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a round is in flight: collect it first");
        return NULL;
    }
    PyObject *fds = PySequence_Fast(fds_arg, "fds must be a sequence");
    if (fds == NULL) {
        return NULL;
    }
    PyObject *runs = PySequence_Fast(runs_arg, "runs must be a sequence");
    if (runs == NULL) {
        Py_DECREF(fds);
        return NULL;
    }
    Py_ssize_t nfds = PySequence_Fast_GET_SIZE(fds), nruns = PySequence_Fast_GET_SIZE(runs);
    int *fd_array = malloc(sizeof(int) * (size_t)(nfds ? nfds : 1));
    Run *run_array = malloc(sizeof(Run) * (size_t)(nruns ? nruns : 1));
    if (fd_array == NULL || run_array == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nfds; i++) {
        if (read_fd(PySequence_Fast_GET_ITEM(fds, i), &fd_array[i]) < 0) {
            goto fail;
        }
    }
    for (Py_ssize_t i = 0; i < nruns; i++) {
        PyObject *run = PySequence_Fast_GET_ITEM(runs, i);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 3) {
            PyErr_SetString(PyExc_TypeError, "a run is a tuple (fd, offset, length)");
            goto fail;
        }
        if (read_fd(PyTuple_GET_ITEM(run, 0), &run_array[i].fd) < 0) {
            goto fail;
        }
        run_array[i].offset = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 1));
        run_array[i].length = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 2));
        if (PyErr_Occurred()) {
            goto fail;
        }
    }
    Py_DECREF(fds);
    Py_DECREF(runs);
    pthread_mutex_lock(&self->mu);
    self->fds = fd_array;
    self->nfds = nfds;
    self->runs = run_array;
    self->nruns = nruns;
    self->busy = self->pending = 1;
    self->done = 0;
    self->error = 0;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    Py_RETURN_NONE;
fail:
    free(fd_array);
    free(run_array);
    Py_DECREF(fds);
    Py_DECREF(runs);
    return NULL;
}

static PyObject *Syncer_collect(Syncer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->event_fd >= 0) {
        uint64_t count;
        ssize_t got;
        do {
            got = read(self->event_fd, &count, sizeof count);
        } while (got < 0 && errno == EINTR);
    }
    pthread_mutex_lock(&self->mu);
    int done = self->busy && self->done;
    int error = self->error;
    if (done) {
        self->busy = self->done = 0;
        free_round(self);
    }
    pthread_mutex_unlock(&self->mu);
    if (!done) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(error);
}

static PyObject *Syncer_fileno(Syncer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->event_fd < 0) {
        PyErr_SetString(PyExc_ValueError, "the Syncer is closed");
        return NULL;
    }
    return PyLong_FromLong(self->event_fd);
}

static PyObject *Syncer_close(Syncer *self, PyObject *Py_UNUSED(ignored)) {
    stop(self);
    Py_RETURN_NONE;
}

static PyObject *Syncer_busy(Syncer *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->busy);
}

static PyMethodDef Syncer_methods[] = {
    {"submit", (PyCFunction)Syncer_submit, METH_VARARGS,
     "submit(fds, runs): fdatasync fds, then drop the runs (fd, offset, length) from the page "
     "cache; every descriptor is closed afterwards. One round at a time."},
    {"collect", (PyCFunction)Syncer_collect, METH_NOARGS,
     "The finished round's errno (0: every fdatasync succeeded), or None while it runs."},
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS,
     "An eventfd that turns readable when a round is done."},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS,
     "Stop the thread, after the round in flight; idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Syncer_getset[] = {
    {"busy", (getter)Syncer_busy, NULL, "A round was submitted and not yet collected.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dledger.log._sync_native.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fdatasync rounds on a thread that never takes the GIL.",
    .tp_new = Syncer_new,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
    .tp_getset = Syncer_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sync_native",
    "fdatasync rounds on a thread that never takes the GIL (dledger/log/sync_native.c).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sync_native(void) {
    if (PyType_Ready(&SyncerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
