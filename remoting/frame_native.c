/* remoting._frame_native: the usual frame of remoting/frame.py's FrameDecoder, in C.
 *
 *   json_frames(buf, start, frame_max, loads, command_type, json, other_language, ext_max)
 *     -> (commands, start)
 *
 *     Decodes the whole frames of `buf` (a bytearray) from `start` on while each is the usual
 *     one: a length within frame_max that covers its header, serialization 0 (JSON), a header
 *     that `loads` (orjson.loads) reads as an object whose code and opaque are 32-bit integers,
 *     whose flag and version are absent or 32-bit integers, whose remark and language are
 *     absent, null or text, and whose extFields is absent, null or an object of at most
 *     `ext_max` text values. Each becomes a `command_type` (remoting.command.RemotingCommand)
 *     as FrameDecoder._next makes it, with `json` (SerializeType.JSON) as its serialization and
 *     `other_language` where the header names none. It stops at the first frame that is not
 *     whole yet or is anything else, without consuming it: FrameDecoder then reads that one in
 *     Python, which waits for more bytes or names what is wrong. `commands`: those decoded;
 *     `start`: where the first frame not decoded begins.
 *
 * The Python decoder remains the definition: tests/remoting/test_frame_native.py holds this to
 * it for arbitrary and damaged streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A dict's value for `key`, borrowed; NULL when absent. */
static PyObject *get(PyObject *dict, PyObject *key) { return PyDict_GetItemWithError(dict, key); }

/* An exact int within int32 into *out; 0 for anything else. */
static int int32_of(PyObject *value, long *out) {
    if (value == NULL || !PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || v < INT32_MIN || v > INT32_MAX) return 0;
    *out = (long)v;
    return 1;
}

static PyObject *KEY_CODE, *KEY_OPAQUE, *KEY_FLAG, *KEY_VERSION, *KEY_REMARK, *KEY_LANGUAGE,
    *KEY_EXT, *EMPTY_TEXT;

/* The command of one usual frame's header and body, or NULL with no error set (not usual)
 * or with one set (out of memory). */
static PyObject *command(PyObject *header_object, PyObject *body, PyTypeObject *command_type,
                         PyObject *json, PyObject *other_language, Py_ssize_t ext_max) {
    if (!PyDict_CheckExact(header_object)) return NULL;
    long code, opaque, flag = 0, version = 0;
    if (!int32_of(get(header_object, KEY_CODE), &code)) return NULL;
    if (!int32_of(get(header_object, KEY_OPAQUE), &opaque)) return NULL;
    PyObject *v = get(header_object, KEY_FLAG);
    if (v != NULL && !int32_of(v, &flag)) return NULL;
    v = get(header_object, KEY_VERSION);
    if (v != NULL && !int32_of(v, &version)) return NULL;
    PyObject *remark = get(header_object, KEY_REMARK);
    if (remark == NULL || remark == Py_None || (PyUnicode_CheckExact(remark) &&
                                                PyUnicode_GET_LENGTH(remark) == 0))
        remark = EMPTY_TEXT; /* `remark or ""` */
    else if (!PyUnicode_CheckExact(remark))
        return NULL;
    PyObject *language = get(header_object, KEY_LANGUAGE);
    if (language == NULL || language == Py_None ||
        (PyUnicode_CheckExact(language) && PyUnicode_GET_LENGTH(language) == 0))
        language = other_language; /* `language or OTHER_LANGUAGE` */
    else if (!PyUnicode_CheckExact(language))
        return NULL;
    PyObject *ext = get(header_object, KEY_EXT), *fields;
    if (ext == NULL || ext == Py_None) {
        fields = PyDict_New();
        if (fields == NULL) return NULL;
    } else {
        if (!PyDict_CheckExact(ext) || PyDict_GET_SIZE(ext) > ext_max) return NULL;
        Py_ssize_t at = 0;
        PyObject *key, *value;
        while (PyDict_Next(ext, &at, &key, &value))
            if (!PyUnicode_CheckExact(value)) return NULL; /* a number, a null: Python's */
        fields = Py_NewRef(ext); /* all text: the copy Python makes would be equal */
    }
    if (PyErr_Occurred()) {
        Py_DECREF(fields);
        return NULL;
    }
    PyObject *items[9] = {PyLong_FromLong(code), PyLong_FromLong(opaque), PyLong_FromLong(flag),
                          Py_NewRef(remark), fields, Py_NewRef(body), Py_NewRef(language),
                          PyLong_FromLong(version), Py_NewRef(json)};
    PyObject *result = NULL;
    for (int k = 0; k < 9; k++)
        if (items[k] == NULL) goto fail; /* out of memory */
    result = command_type->tp_alloc(command_type, 9);
    if (result == NULL) goto fail;
    for (int k = 0; k < 9; k++) PyTuple_SET_ITEM(result, k, items[k]);
    return result;
fail:
    for (int k = 0; k < 9; k++) Py_XDECREF(items[k]);
    return NULL;
}

static PyObject *json_frames(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *buffer, *loads, *json, *other_language;
    PyTypeObject *command_type;
    Py_ssize_t start, frame_max, ext_max;
    if (!PyArg_ParseTuple(args, "O!nnOO!OOn", &PyByteArray_Type, &buffer, &start, &frame_max,
                          &loads, &PyType_Type, &command_type, &json, &other_language, &ext_max))
        return NULL;
    if (!PyType_IsSubtype(command_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "json_frames: the command type is a tuple's");
        return NULL;
    }
    PyObject *commands = PyList_New(0);
    if (commands == NULL) return NULL;
    Py_ssize_t length_of_buffer = PyByteArray_GET_SIZE(buffer);
    if (start < 0 || start > length_of_buffer) {
        Py_DECREF(commands);
        PyErr_SetString(PyExc_ValueError, "json_frames: start outside the buffer");
        return NULL;
    }
    while (1) {
        /* the buffer's address is read again each time: nothing here resizes it, but loads is
         * Python code in principle */
        const unsigned char *b = (const unsigned char *)PyByteArray_AS_STRING(buffer);
        Py_ssize_t available = PyByteArray_GET_SIZE(buffer) - start;
        if (available < 8) break;
        uint32_t length = be32(b + start), mark = be32(b + start + 4);
        uint32_t header_length = mark & 0xFFFFFF;
        if ((Py_ssize_t)length > frame_max || length < 4 || (mark >> 24) != 0 ||
            header_length > length - 4 || available < 4 + (Py_ssize_t)length)
            break;
        PyObject *header = PyBytes_FromStringAndSize((const char *)b + start + 8, header_length);
        if (header == NULL) goto error;
        PyObject *body = PyBytes_FromStringAndSize((const char *)b + start + 8 + header_length,
                                                   length - 4 - header_length);
        if (body == NULL) {
            Py_DECREF(header);
            goto error;
        }
        PyObject *header_object = PyObject_CallOneArg(loads, header);
        Py_DECREF(header);
        if (header_object == NULL) { /* not JSON: FrameDecoder says so */
            Py_DECREF(body);
            PyErr_Clear();
            break;
        }
        PyObject *made = command(header_object, body, command_type, json, other_language,
                                 ext_max);
        Py_DECREF(header_object);
        Py_DECREF(body);
        if (made == NULL) {
            if (PyErr_Occurred()) goto error;
            break;
        }
        int appended = PyList_Append(commands, made);
        Py_DECREF(made);
        if (appended < 0) goto error;
        start += 4 + (Py_ssize_t)length;
    }
    PyObject *result = Py_BuildValue("(Nn)", commands, start);
    return result;
error:
    Py_DECREF(commands);
    return NULL;
}

static PyMethodDef methods[] = {
    {"json_frames", json_frames, METH_VARARGS, "The usual JSON-header frames from `start` on."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "remoting._frame_native",
    "The usual frame of remoting/frame.py's FrameDecoder, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frame_native(void) {
    KEY_CODE = PyUnicode_InternFromString("code");
    KEY_OPAQUE = PyUnicode_InternFromString("opaque");
    KEY_FLAG = PyUnicode_InternFromString("flag");
    KEY_VERSION = PyUnicode_InternFromString("version");
    KEY_REMARK = PyUnicode_InternFromString("remark");
    KEY_LANGUAGE = PyUnicode_InternFromString("language");
    KEY_EXT = PyUnicode_InternFromString("extFields");
    EMPTY_TEXT = PyUnicode_InternFromString("");
    if (!KEY_CODE || !KEY_OPAQUE || !KEY_FLAG || !KEY_VERSION || !KEY_REMARK || !KEY_LANGUAGE ||
        !KEY_EXT || !EMPTY_TEXT)
        return NULL;
    return PyModule_Create(&module);
}
