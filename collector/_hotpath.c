/* The pipelining integration's per-action wrappers in C (bubblescope.collector._hotpath).
 *
 * They run for every compute action and P2P batch of a pipeline schedule (tens a step). The
 * Python wrappers in pipelining.py spend most of their cost on the wrapper's own frame and
 * bytecode (about 3 us per call with the caches cold between actions); these do the same work
 * with a C call. Behaviour is the Python wrappers', row for row: pipelining.py documents it, and
 * tests run both and compare. native.py loads this module only when its clock agrees with
 * time.perf_counter_ns (the recorder's clock); without a compiler the Python wrappers serve.
 *
 * Recording never raises into the training loop: an error while recording drops that span
 * (the wrapped call's own result or exception always passes through unchanged).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

static PyObject *s_step_index, *s_spans, *s_capacity, *s_add, *s_paused_depth, *s_quiet_depth,
    *s_recorder, *s_tag, *s_op, *s_name, *s_peer, *s_tensor, *s_nbytes, *s_isend, *s_send, *s_recv,
    *s_pp, *s_full_backward, *s_repeat_at, *s_is_last, *s_forward, *s_extend_last, *s_waiting, *s_p2p;

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *
hotpath_now_ns(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(now_ns());
}

/* recorder.<name> as a C integer; -1 with an exception set on failure. */
static Py_ssize_t
int_attribute(PyObject *recorder, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(recorder, name);
    if (value == NULL)
        return -1;
    Py_ssize_t result = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return result;
}

/* recorder.quiet_depth += delta */
static int
shift_quiet(PyObject *recorder, long delta)
{
    Py_ssize_t depth = int_attribute(recorder, s_quiet_depth);
    if (depth == -1 && PyErr_Occurred())
        return -1;
    PyObject *value = PyLong_FromSsize_t(depth + delta);
    if (value == NULL)
        return -1;
    int status = PyObject_SetAttr(recorder, s_quiet_depth, value);
    Py_DECREF(value);
    return status;
}

/* Buffer one span, as Recorder.add with its fast path inlined: appended to recorder.spans while
 * it has room, else handed to recorder.add (which drops and counts it). ``fields`` are the nine
 * after the step index: kind, start, end, stage, micro-batch, peer, bytes, group, name.
 * Returns the row's index in the buffer, -1 when it went to recorder.add, -2 on error. */
static Py_ssize_t
record(PyObject *recorder, PyObject *fields[9])
{
    Py_ssize_t index = -2;
    PyObject *spans = PyObject_GetAttr(recorder, s_spans);
    if (spans == NULL)
        return -2;
    Py_ssize_t capacity = int_attribute(recorder, s_capacity);
    if (capacity == -1 && PyErr_Occurred())
        goto done;
    if (PyList_CheckExact(spans) && PyList_GET_SIZE(spans) < capacity) {
        PyObject *row = PyTuple_New(10);
        if (row == NULL)
            goto done;
        PyObject *step = PyObject_GetAttr(recorder, s_step_index);
        if (step == NULL) {
            Py_DECREF(row);
            goto done;
        }
        PyTuple_SET_ITEM(row, 0, step);
        for (int i = 0; i < 9; i++) {
            Py_INCREF(fields[i]);
            PyTuple_SET_ITEM(row, i + 1, fields[i]);
        }
        if (PyList_Append(spans, row) == 0)
            index = PyList_GET_SIZE(spans) - 1;
        Py_DECREF(row);
    }
    else {
        PyObject *result = PyObject_VectorcallMethod(
            s_add, (PyObject *[]){recorder, fields[0], fields[1], fields[2], fields[3], fields[4], fields[5],
                                  fields[6], fields[7], fields[8]},
            10, NULL);
        if (result != NULL) {
            index = -1;
            Py_DECREF(result);
        }
    }
done:
    Py_DECREF(spans);
    return index;
}

/* record() with two clock readings; the caller's pending exception (if any) is kept. */
static Py_ssize_t
record_times(PyObject *recorder, PyObject *kind, long long start, long long end, PyObject *stage,
             PyObject *microbatch, PyObject *peer, PyObject *nbytes, PyObject *group, PyObject *name)
{
    PyObject *start_ns = PyLong_FromLongLong(start);
    PyObject *end_ns = PyLong_FromLongLong(end);
    Py_ssize_t index = -2;
    if (start_ns != NULL && end_ns != NULL) {
        PyObject *fields[9] = {kind, start_ns, end_ns, stage, microbatch, peer, nbytes, group, name};
        index = record(recorder, fields);
    }
    Py_XDECREF(start_ns);
    Py_XDECREF(end_ns);
    return index;
}

/* A copy of the span row ``row`` with its end time replaced; NULL with an exception on failure. */
static PyObject *
with_end(PyObject *row, PyObject *end_ns)
{
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 4) {
        PyErr_SetString(PyExc_TypeError, "a span row is a tuple of at least four fields");
        return NULL;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(row);
    PyObject *copy = PyTuple_New(size);
    if (copy == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < size; i++)
        PyTuple_SET_ITEM(copy, i, Py_NewRef(i == 3 ? end_ns : PyTuple_GET_ITEM(row, i)));
    return copy;
}

/* ---- Wrapper: one callable type, four behaviours (the module functions below build them) --- */

typedef struct {
    PyObject_HEAD
    PyObject *wrapped;   /* the original callable */
    PyObject *recorder;  /* timed, loss: the Recorder; batch, wait: the pipelining state dict */
    PyObject *extra1;    /* timed: stage index; batch, wait: the pending dict */
    PyObject *extra2;    /* timed: kind; wait: the merge function for several recvs */
    PyObject *extra3;    /* timed: "backward_input" when the kind is backward, else NULL */
    long long blocked_ns; /* wait: a longer wait blocked */
    PyObject *dict;
    vectorcallfunc vectorcall;
} Wrapper;

/* Positional argument ``position`` or keyword ``name`` of a vectorcall; borrowed, NULL if absent. */
static PyObject *
argument(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t position, const char *name)
{
    if (nargs > position)
        return args[position];
    if (kwnames == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), name) == 0)
            return args[nargs + i];
    }
    return NULL;
}

/* The active recorder of the pipelining state, a new reference; NULL (no error) when none or paused. */
static PyObject *
active_recorder(PyObject *state)
{
    PyObject *recorder = PyDict_GetItemWithError(state, s_recorder);
    if (recorder == NULL || recorder == Py_None) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(recorder);
    Py_ssize_t paused = int_attribute(recorder, s_paused_depth);
    if (paused != 0) {
        PyErr_Clear();
        Py_DECREF(recorder);
        return NULL;
    }
    return recorder;
}

/* Call ``wrapped`` with the recorder's quiet_depth raised (the collectives layer then records
 * nothing inside); the two clock readings around it go to *start and *end. */
static PyObject *
call_quietly(PyObject *recorder, PyObject *wrapped, PyObject *const *args, size_t nargsf, PyObject *kwnames,
             long long *start, long long *end)
{
    int raised = shift_quiet(recorder, 1) == 0;
    if (!raised)
        PyErr_Clear();
    *start = now_ns();
    PyObject *result = PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
    *end = now_ns();
    if (raised) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (shift_quiet(recorder, -1) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
    return result;
}

/* timed: a stage's *_one_chunk as a compute span (pipelining._timed) */
static PyObject *
timed_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wrapper *self = (Wrapper *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    long long start = now_ns();
    PyObject *result = PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    long long end = now_ns();
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *kind = self->extra2;
    if (self->extra3 != NULL) {
        PyObject *full_backward = argument(args, nargs, kwnames, PY_SSIZE_T_MAX, "full_backward");
        int full = full_backward == NULL ? 1 : PyObject_IsTrue(full_backward);
        if (full == 0)
            kind = self->extra3;
        else if (full < 0)
            PyErr_Clear();
    }
    PyObject *chunk = argument(args, nargs, kwnames, 0, "chunk_id");
    if (chunk == NULL)
        chunk = Py_None;
    record_times(self->recorder, kind, start, end, self->extra1, chunk, Py_None, Py_None, Py_None, Py_None);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return result;
}

/* batch: record the sends of a posted P2P batch and remember its recvs for the wait */
static int
note_batch(Wrapper *self, PyObject *recorder, PyObject *ops, PyObject *works, long long posted, long long done)
{
    int status = -1;
    PyObject *sequence = NULL, *recvs = PyList_New(0), *sends = PyList_New(0);
    PyObject *posted_ns = PyLong_FromLongLong(posted), *done_ns = PyLong_FromLongLong(done);
    if (recvs == NULL || sends == NULL || posted_ns == NULL || done_ns == NULL)
        goto done;
    sequence = PySequence_Fast(ops, "p2p_ops must be a sequence");
    if (sequence == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); i++) {
        PyObject *op = Py_NewRef(PySequence_Fast_GET_ITEM(sequence, i));  /* held: GetAttr may run code */
        PyObject *tag = PyObject_GetAttr(op, s_tag);
        if (tag == NULL)
            PyErr_Clear();
        int tagged = tag != NULL && PyTuple_Check(tag) && PyTuple_GET_SIZE(tag) == 3;
        PyObject *name = tagged ? PyTuple_GET_ITEM(tag, 0) : Py_None;
        PyObject *stage = tagged ? PyTuple_GET_ITEM(tag, 1) : Py_None;
        PyObject *microbatch = tagged ? PyTuple_GET_ITEM(tag, 2) : Py_None;
        int is_send = 0;
        PyObject *function = PyObject_GetAttr(op, s_op);
        PyObject *function_name = function == NULL ? NULL : PyObject_GetAttr(function, s_name);
        if (function_name == NULL)
            PyErr_Clear();
        else
            is_send = PyUnicode_Check(function_name) && PyUnicode_Compare(function_name, s_isend) == 0;
        Py_XDECREF(function_name);
        Py_XDECREF(function);
        PyObject *peer = PyObject_GetAttr(op, s_peer);
        PyObject *tensor = peer == NULL ? NULL : PyObject_GetAttr(op, s_tensor);
        PyObject *nbytes = tensor == NULL ? NULL : PyObject_GetAttr(tensor, s_nbytes);
        if (tensor != NULL && nbytes == NULL) {
            PyErr_Clear();
            nbytes = PyLong_FromLong(0);
        }
        int failed = nbytes == NULL;
        if (!failed && is_send) {
            PyObject *fields[9] = {s_send, posted_ns, done_ns, stage, microbatch, peer, nbytes, s_pp, name};
            Py_ssize_t index = record(recorder, fields);
            if (index == -2)
                failed = 1;
            else if (index >= 0) {
                PyObject *position = PyLong_FromSsize_t(index);
                failed = position == NULL || PyList_Append(sends, position) < 0;
                Py_XDECREF(position);
            }
        }
        else if (!failed) {
            PyObject *recv = PyTuple_Pack(5, stage, microbatch, peer, name, nbytes);
            failed = recv == NULL || PyList_Append(recvs, recv) < 0;
            Py_XDECREF(recv);
        }
        Py_DECREF(op);
        Py_XDECREF(tag);
        Py_XDECREF(peer);
        Py_XDECREF(tensor);
        Py_XDECREF(nbytes);
        if (failed)
            goto done;
    }
    if (PyList_GET_SIZE(recvs) || PyList_GET_SIZE(sends)) {
        PyObject *spans = PyObject_GetAttr(recorder, s_spans);
        if (spans == NULL || !PyList_Check(spans)) {
            Py_XDECREF(spans);
            goto done;
        }
        PyObject *entry = Py_BuildValue("(OOOOn)", works, recvs, sends, spans, PyList_GET_SIZE(spans));
        PyObject *key = PyLong_FromVoidPtr(works);
        int stored = entry != NULL && key != NULL && PyDict_SetItem(self->extra1, key, entry) == 0;
        Py_XDECREF(entry);
        Py_XDECREF(key);
        Py_DECREF(spans);
        if (!stored)
            goto done;
    }
    status = 0;
done:
    Py_XDECREF(sequence);
    Py_XDECREF(recvs);
    Py_XDECREF(sends);
    Py_XDECREF(posted_ns);
    Py_XDECREF(done_ns);
    return status;
}

static PyObject *
batch_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wrapper *self = (Wrapper *)callable;
    PyObject *recorder = active_recorder(self->recorder);
    if (recorder == NULL)
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    long long posted, done;
    PyObject *works = call_quietly(recorder, self->wrapped, args, nargsf, kwnames, &posted, &done);
    PyObject *ops = argument(args, PyVectorcall_NARGS(nargsf), kwnames, 0, "p2p_ops");
    if (works != NULL && ops != NULL)
        note_batch(self, recorder, ops, works, posted, done);
    if (works != NULL)
        PyErr_Clear();  /* a recording error never reaches the training loop */
    Py_DECREF(recorder);
    return works;
}

/* wait: the recvs of a batch become recv spans over the wait; blocked sends are stretched */
static int
note_wait(Wrapper *self, PyObject *recorder, PyObject *entry, long long started, long long finished)
{
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5)
        return 0;
    PyObject *recvs = PyTuple_GET_ITEM(entry, 1), *sends = PyTuple_GET_ITEM(entry, 2);
    PyObject *posted_spans = PyTuple_GET_ITEM(entry, 3);
    Py_ssize_t posted_length = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 4));
    if (posted_length == -1 && PyErr_Occurred())
        return -1;
    int status = -1;
    PyObject *started_ns = PyLong_FromLongLong(started), *finished_ns = PyLong_FromLongLong(finished);
    PyObject *spans = PyObject_GetAttr(recorder, s_spans);
    if (started_ns == NULL || finished_ns == NULL || spans == NULL || !PyList_Check(recvs) || !PyList_Check(sends))
        goto done;
    int quiet_since_post = spans == posted_spans && PyList_GET_SIZE(spans) == posted_length;
    PyObject *merged = PyList_GET_SIZE(recvs) < 2 ? Py_NewRef(recvs) : PyObject_CallOneArg(self->extra2, recvs);
    if (merged == NULL)
        goto done;
    PyObject *sequence = PySequence_Fast(merged, "merged recvs must be a sequence");
    Py_DECREF(merged);
    if (sequence == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); i++) {
        PyObject *recv = PySequence_Fast_GET_ITEM(sequence, i);
        if (!PyTuple_Check(recv) || PyTuple_GET_SIZE(recv) != 5)
            continue;
        PyObject **item = &PyTuple_GET_ITEM(recv, 0);  /* stage, micro-batch, peer, name, size */
        PyObject *fields[9] = {s_recv, started_ns, finished_ns, item[0], item[1], item[2], item[4], s_pp, item[3]};
        if (record(recorder, fields) == -2) {
            Py_DECREF(sequence);
            goto done;
        }
    }
    Py_DECREF(sequence);
    if (PyList_GET_SIZE(sends) && finished - started > self->blocked_ns) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sends); i++) {
            PyObject *position = PyList_GET_ITEM(sends, i);
            if (quiet_since_post) {  /* the sends are still the newest spans of this step's buffer */
                Py_ssize_t index = PyLong_AsSsize_t(position);
                if (index < 0 || index >= PyList_GET_SIZE(spans))
                    goto done;
                PyObject *stretched = with_end(PyList_GET_ITEM(spans, index), finished_ns);
                if (stretched == NULL || PyList_SetItem(spans, index, stretched) < 0)  /* steals it */
                    goto done;
            }
            else {
                PyObject *result = PyObject_CallMethodObjArgs(recorder, s_repeat_at, position, posted_spans,
                                                              started_ns, finished_ns, NULL);
                if (result == NULL)
                    goto done;
                Py_DECREF(result);
            }
        }
    }
    status = 0;
done:
    Py_XDECREF(started_ns);
    Py_XDECREF(finished_ns);
    Py_XDECREF(spans);
    return status;
}

/* recorder.waiting = ("p2p", entry, now): what the shipper's watchdog reports while this wait
 * blocks (recorder.waiting_op decodes it); never raises */
static void
set_waiting(PyObject *recorder, PyObject *entry)
{
    PyObject *since = PyLong_FromLongLong(now_ns());
    PyObject *waiting = since == NULL ? NULL : PyTuple_Pack(3, s_p2p, entry, since);
    if (waiting == NULL || PyObject_SetAttr(recorder, s_waiting, waiting) < 0)
        PyErr_Clear();
    Py_XDECREF(waiting);
    Py_XDECREF(since);
}

/* recorder.waiting = None, keeping any exception the wait raised */
static void
clear_waiting(PyObject *recorder)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PyObject_SetAttr(recorder, s_waiting, Py_None) < 0)
        PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

static PyObject *
wait_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wrapper *self = (Wrapper *)callable;
    PyObject *work = argument(args, PyVectorcall_NARGS(nargsf), kwnames, 0, "work");
    PyObject *entry = NULL;
    if (work != NULL) {
        PyObject *key = PyLong_FromVoidPtr(work);
        if (key != NULL) {
            entry = PyDict_GetItemWithError(self->extra1, key);
            Py_XINCREF(entry);
            if (entry != NULL)
                PyDict_DelItem(self->extra1, key);
            Py_DECREF(key);
        }
        PyErr_Clear();
    }
    PyObject *recorder = entry == NULL ? NULL : PyDict_GetItemWithError(self->recorder, s_recorder);
    if (recorder == NULL || recorder == Py_None) {
        PyErr_Clear();
        Py_XDECREF(entry);
        return PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    }
    Py_INCREF(recorder);
    set_waiting(recorder, entry);
    long long started, finished;
    PyObject *result = call_quietly(recorder, self->wrapped, args, nargsf, kwnames, &started, &finished);
    clear_waiting(recorder);
    if (result != NULL) {
        note_wait(self, recorder, entry, started, finished);
        PyErr_Clear();  /* a recording error never reaches the training loop */
    }
    Py_DECREF(recorder);
    Py_DECREF(entry);
    return result;
}

/* loss: the last stage's loss is part of its forward: Recorder.extend_last stretches the newest
 * forward span of the micro-batch to the loss's end (pipelining._extend_forward_by_loss) */
static PyObject *
loss_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Wrapper *self = (Wrapper *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *result = PyObject_Vectorcall(self->wrapped, args, nargsf, kwnames);
    long long end = now_ns();
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *stage = argument(args, nargs, kwnames, 0, "stage");
    PyObject *microbatch = argument(args, nargs, kwnames, 3, "mb_index");
    PyObject *is_last = stage == NULL ? NULL : PyObject_GetAttr(stage, s_is_last);
    PyObject *end_ns = PyLong_FromLongLong(end);
    if (is_last != NULL && microbatch != NULL && end_ns != NULL && PyObject_IsTrue(is_last) == 1)
        Py_XDECREF(PyObject_CallMethodObjArgs(self->recorder, s_extend_last, s_forward, microbatch, end_ns, NULL));
    Py_XDECREF(is_last);
    Py_XDECREF(end_ns);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return result;
}

/* ---- the type and the module ---------------------------------------------------------------- */

static int
wrapper_traverse(Wrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->wrapped);
    Py_VISIT(self->recorder);
    Py_VISIT(self->extra1);
    Py_VISIT(self->extra2);
    Py_VISIT(self->extra3);
    Py_VISIT(self->dict);
    return 0;
}

static int
wrapper_clear(Wrapper *self)
{
    Py_CLEAR(self->wrapped);
    Py_CLEAR(self->recorder);
    Py_CLEAR(self->extra1);
    Py_CLEAR(self->extra2);
    Py_CLEAR(self->extra3);
    Py_CLEAR(self->dict);
    return 0;
}

static void
wrapper_dealloc(Wrapper *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    wrapper_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef wrapper_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(Wrapper, dict), READONLY},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Wrapper, vectorcall), READONLY},
    {NULL},
};

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyType_Slot wrapper_slots[] = {
    {Py_tp_getset, wrapper_getset},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_traverse, wrapper_traverse},
    {Py_tp_clear, wrapper_clear},
    {Py_tp_dealloc, wrapper_dealloc},
    {Py_tp_members, wrapper_members},
    {Py_tp_doc, "A pipelining wrapper in C; built by the module's functions."},
    {0, NULL},
};

static PyType_Spec wrapper_spec = {
    "bubblescope.collector._hotpath.Wrapper", sizeof(Wrapper), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_DISALLOW_INSTANTIATION |
        Py_TPFLAGS_IMMUTABLETYPE,
    wrapper_slots,
};

static PyTypeObject *wrapper_type;  /* one interpreter: the collector is not for subinterpreters */

static PyObject *
make_wrapper(vectorcallfunc call, PyObject *wrapped, PyObject *recorder, PyObject *extra1, PyObject *extra2,
             PyObject *extra3, long long blocked_ns)
{
    if (!PyCallable_Check(wrapped)) {
        PyErr_SetString(PyExc_TypeError, "the wrapped object must be callable");
        return NULL;
    }
    Wrapper *self = PyObject_GC_New(Wrapper, wrapper_type);
    if (self == NULL)
        return NULL;
    self->wrapped = Py_NewRef(wrapped);
    self->recorder = Py_NewRef(recorder);
    self->extra1 = Py_XNewRef(extra1);
    self->extra2 = Py_XNewRef(extra2);
    self->extra3 = Py_XNewRef(extra3);
    self->blocked_ns = blocked_ns;
    self->dict = NULL;
    self->vectorcall = call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
hotpath_timed(PyObject *module, PyObject *args)
{
    PyObject *method, *recorder, *stage, *kind;
    int split_backward;
    if (!PyArg_ParseTuple(args, "OOOUp:timed", &method, &recorder, &stage, &kind, &split_backward))
        return NULL;
    PyObject *input_kind = split_backward ? PyUnicode_InternFromString("backward_input") : NULL;
    if (split_backward && input_kind == NULL)
        return NULL;
    PyObject *wrapper = make_wrapper(timed_call, method, recorder, stage, kind, input_kind, 0);
    Py_XDECREF(input_kind);
    return wrapper;
}

static PyObject *
hotpath_batch_p2p(PyObject *module, PyObject *args)
{
    PyObject *original, *state, *pending;
    if (!PyArg_ParseTuple(args, "OO!O!:batch_p2p", &original, &PyDict_Type, &state, &PyDict_Type, &pending))
        return NULL;
    return make_wrapper(batch_call, original, state, pending, NULL, NULL, 0);
}

static PyObject *
hotpath_wait_batch_p2p(PyObject *module, PyObject *args)
{
    PyObject *original, *state, *pending, *merge;
    long long blocked_ns;
    if (!PyArg_ParseTuple(args, "OO!O!OL:wait_batch_p2p", &original, &PyDict_Type, &state, &PyDict_Type, &pending,
                          &merge, &blocked_ns))
        return NULL;
    return make_wrapper(wait_call, original, state, pending, merge, NULL, blocked_ns);
}

static PyObject *
hotpath_loss(PyObject *module, PyObject *args)
{
    PyObject *compute_loss, *recorder;
    if (!PyArg_ParseTuple(args, "OO:loss", &compute_loss, &recorder))
        return NULL;
    return make_wrapper(loss_call, compute_loss, recorder, NULL, NULL, NULL, 0);
}

static PyMethodDef hotpath_methods[] = {
    {"now_ns", hotpath_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in nanoseconds (time.perf_counter_ns on Linux)."},
    {"timed", hotpath_timed, METH_VARARGS,
     "timed(method, recorder, stage_index, kind, split_backward): pipelining._timed's wrapper."},
    {"batch_p2p", hotpath_batch_p2p, METH_VARARGS,
     "batch_p2p(original, state, pending): the _batch_p2p wrapper of pipelining._patch_p2p_once."},
    {"wait_batch_p2p", hotpath_wait_batch_p2p, METH_VARARGS,
     "wait_batch_p2p(original, state, pending, merge_recvs, blocked_ns): the _wait_batch_p2p wrapper."},
    {"loss", hotpath_loss, METH_VARARGS, "loss(compute_loss, recorder): the _maybe_compute_loss wrapper."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The pipelining integration's per-action wrappers in C.", -1, hotpath_methods,
};

#define INTERN(variable, text)                                   \
    if ((variable = PyUnicode_InternFromString(text)) == NULL)   \
        return NULL;

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    INTERN(s_step_index, "step_index");
    INTERN(s_spans, "spans");
    INTERN(s_capacity, "capacity");
    INTERN(s_add, "add");
    INTERN(s_paused_depth, "paused_depth");
    INTERN(s_quiet_depth, "quiet_depth");
    INTERN(s_recorder, "recorder");
    INTERN(s_tag, "_bubblescope_tag");
    INTERN(s_op, "op");
    INTERN(s_name, "__name__");
    INTERN(s_peer, "peer");
    INTERN(s_tensor, "tensor");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_isend, "isend");
    INTERN(s_send, "send");
    INTERN(s_recv, "recv");
    INTERN(s_pp, "pp");
    INTERN(s_full_backward, "full_backward");
    INTERN(s_repeat_at, "repeat_at");
    INTERN(s_is_last, "is_last");
    INTERN(s_forward, "forward");
    INTERN(s_extend_last, "extend_last");
    INTERN(s_waiting, "waiting");
    INTERN(s_p2p, "p2p");
    wrapper_type = (PyTypeObject *)PyType_FromSpec(&wrapper_spec);
    if (wrapper_type == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Wrapper", (PyObject *)wrapper_type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
