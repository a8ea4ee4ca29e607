/* One-pass forms of two numpy chains of lpt: the output stage (lpt.kernels.output_stage) and
 * the dequantize-join-quantize of a residual Add or Mul (lpt.kernels.join_q). Same float32
 * operations, in the same order, per element.
 *
 * numpy runs each operation of a chain as a pass over memory; here each element goes through
 * the whole chain while it is in a register. The results are bit-identical to the numpy forms
 * (tests/kernels/test_native.py checks it, with hypothesis and on extreme values), because:
 * - every operation is one IEEE float32 operation: the build passes -ffp-contract=off, so no
 *   multiply and add fuse into an FMA, and no -ffast-math, so nothing is reassociated;
 * - the clips keep a NaN as numpy's maximum/minimum do; the saturation drops it as numpy's
 *   fmax/fmin do; rounding is half to even (round_half_even); int -> float32 conversion rounds
 *   to nearest, as numpy's astype does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_VIEWS 8

typedef struct {
    Py_buffer views[MAX_VIEWS];
    int held;
} Buffers;

static void release(Buffers *buffers) {
    for (int i = 0; i < buffers->held; i++) PyBuffer_Release(&buffers->views[i]);
    buffers->held = 0;
}

/* A C-contiguous buffer of numpy's `formats` (struct characters, e.g. "Bb"); its item count in *items. */
static const void *take(Buffers *buffers, PyObject *object, const char *formats, int writable, const char *name,
                        Py_ssize_t *items, char *format) {
    Py_buffer *view = &buffers->views[buffers->held];
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    buffers->held++;
    const char *f = view->format;
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (f[0] == '\0' || f[1] != '\0' || strchr(formats, f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: items of type '%s', expected one of '%s'", name, view->format, formats);
        return NULL;
    }
    *items = view->len / view->itemsize;
    if (format) *format = f[0];
    return view->buf;
}

/* A per-channel vector of exactly `channels` values. */
static const float *take_vector(Buffers *buffers, PyObject *object, Py_ssize_t channels, const char *name) {
    Py_ssize_t items;
    const float *data = take(buffers, object, "f", 0, name, &items, NULL);
    if (data != NULL && items != channels) {
        PyErr_Format(PyExc_ValueError, "%s: %zd values for %zd channels", name, items, channels);
        return NULL;
    }
    return data;
}

/* rint for |y| ≤ 2^22: adding 1.5·2^23 leaves no fraction bits, so the float32 addition itself rounds
 * to an integer, half to even (the default rounding mode), and subtracting it back is exact. The
 * levels here are within ±2^9. Unlike a call to rintf, it vectorizes without SSE4.1. */
static inline float round_half_even(float y) { return (y + 12582912.0f) - 12582912.0f; }

/* x = saturate(rint(x / scale) + zero_point) over a block, as lpt.kernels.quantize: fmax, fmin, rint,
 * then + zp. The comparisons are fmaxf/fminf's: a NaN gives the bound, as numpy's fmax/fmin. */
static void quantize_block(float *x, Py_ssize_t n, float scale, int zero_point, int qmin, int qmax) {
    const float zp = (float)zero_point, low = (float)(qmin - zero_point), high = (float)(qmax - zero_point);
    for (Py_ssize_t i = 0; i < n; i++) {
        float y = x[i] / scale;
        y = y >= low ? y : low;
        y = y <= high ? y : high;
        x[i] = round_half_even(y) + zp;
    }
}

static void store_block(const float *levels, Py_ssize_t n, void *out, char format) {
    if (format == 'B') {
        uint8_t *o = out;
        for (Py_ssize_t i = 0; i < n; i++) o[i] = (uint8_t)(int)levels[i];
    } else {
        int8_t *o = out;
        for (Py_ssize_t i = 0; i < n; i++) o[i] = (int8_t)(int)levels[i];
    }
}

static void load_block(const void *q, char format, Py_ssize_t n, float *x) {
    if (format == 'B') {
        const uint8_t *p = q;
        for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)p[i];
    } else {
        const int8_t *p = q;
        for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)p[i];
    }
}

static const char OUTPUT_STAGE_DOC[] =
    "output_stage(acc, out, multiplier, bias, clips, dst_scale, dst_zero_point, qmin, qmax)\n\n"
    "acc int32 [rows, C] -> out [rows, C]: x = f32(acc)*multiplier[c] (+ bias[c]; both float32 [C]), then each\n"
    "(low, high) of clips (float32 [2n]) as min(max(x, low), high), then q = saturate(rint(x / dst_scale) + zp)\n"
    "into uint8/int8 out; a float32 out (dst_scale None) takes x.";

static PyObject *output_stage(PyObject *self, PyObject *args) {
    PyObject *acc_o, *out_o, *multiplier_o, *bias_o, *clips_o, *scale_o;
    int zero_point, qmin, qmax;
    if (!PyArg_ParseTuple(args, "OOOOOOiii", &acc_o, &out_o, &multiplier_o, &bias_o, &clips_o, &scale_o,
                          &zero_point, &qmin, &qmax))
        return NULL;
    Buffers b = {.held = 0};
    Py_ssize_t count, out_count, clip_values;
    char out_format;
    float scale = 1.0f, *row = NULL;
    const int32_t *acc = take(&b, acc_o, "i", 0, "acc", &count, NULL);
    if (acc == NULL) goto fail;
    Py_ssize_t channels = b.views[0].ndim >= 1 ? b.views[0].shape[b.views[0].ndim - 1] : 1;
    void *out = (void *)take(&b, out_o, "Bbf", 1, "out", &out_count, &out_format);
    if (out == NULL) goto fail;
    if (out_count != count) {
        PyErr_Format(PyExc_ValueError, "out has %zd items, acc %zd", out_count, count);
        goto fail;
    }
    const float *multiplier = take_vector(&b, multiplier_o, channels, "multiplier");
    if (multiplier == NULL) goto fail;
    const float *bias = NULL;
    if (bias_o != Py_None && (bias = take_vector(&b, bias_o, channels, "bias")) == NULL) goto fail;
    const float *clips = take(&b, clips_o, "f", 0, "clips", &clip_values, NULL);
    if (clips == NULL) goto fail;
    if ((scale_o == Py_None) != (out_format == 'f')) {
        PyErr_SetString(PyExc_ValueError, "a float32 out takes no dst_scale, an integer out needs one");
        goto fail;
    }
    if (scale_o != Py_None) {
        scale = (float)PyFloat_AsDouble(scale_o);
        if (PyErr_Occurred()) goto fail;
        if ((row = PyMem_RawMalloc(channels * sizeof(float) + 1)) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    Py_ssize_t rows = channels ? count / channels : 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {  /* row by row, each loop below one vectorizable pass */
        const int32_t *a = acc + r * channels;
        float *x = row ? row : (float *)out + r * channels;
        for (Py_ssize_t c = 0; c < channels; c++) x[c] = (float)a[c] * multiplier[c];
        if (bias)
            for (Py_ssize_t c = 0; c < channels; c++) x[c] = x[c] + bias[c];
        for (Py_ssize_t k = 0; k + 1 < clip_values; k += 2) {
            const float low = clips[k], high = clips[k + 1];
            for (Py_ssize_t c = 0; c < channels; c++) x[c] = x[c] < low ? low : x[c];  /* a NaN stays NaN */
            for (Py_ssize_t c = 0; c < channels; c++) x[c] = x[c] > high ? high : x[c];
        }
        if (row) {
            quantize_block(x, channels, scale, zero_point, qmin, qmax);
            store_block(x, channels, (char *)out + r * channels, out_format);
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(row);
    release(&b);
    Py_RETURN_NONE;
fail:
    PyMem_RawFree(row);
    release(&b);
    return NULL;
}

static const char JOIN_DOC[] =
    "join(a, b, out, multiply, a_shift, a_scale, b_shift, b_scale, relu, dst_scale, dst_zero_point, qmin, qmax)\n\n"
    "Elementwise over equally long uint8/int8 a, b and out: x = (f32(a) - a_shift)*a_scale, the same for b,\n"
    "joined by + (or * with `multiply`), max(x, 0) with `relu`, then q = saturate(rint(x / dst_scale) + zp).";

static PyObject *join(PyObject *self, PyObject *args) {
    PyObject *a_o, *b_o, *out_o;
    int multiply, relu, zero_point, qmin, qmax;
    float a_shift, a_scale, b_shift, b_scale, scale;
    if (!PyArg_ParseTuple(args, "OOOpffffpfiii", &a_o, &b_o, &out_o, &multiply, &a_shift, &a_scale, &b_shift,
                          &b_scale, &relu, &scale, &zero_point, &qmin, &qmax))
        return NULL;
    Buffers buffers = {.held = 0};
    Py_ssize_t a_count, b_count, out_count;
    char a_format, b_format, out_format;
    const void *a = take(&buffers, a_o, "Bb", 0, "a", &a_count, &a_format);
    const void *b = a ? take(&buffers, b_o, "Bb", 0, "b", &b_count, &b_format) : NULL;
    void *out = b ? (void *)take(&buffers, out_o, "Bb", 1, "out", &out_count, &out_format) : NULL;
    if (out == NULL) goto fail;
    if (a_count != b_count || a_count != out_count) {
        PyErr_Format(PyExc_ValueError, "a, b and out have %zd, %zd and %zd items", a_count, b_count, out_count);
        goto fail;
    }
    enum { BLOCK = 4096 };
    float x[BLOCK], y[BLOCK];
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t start = 0; start < a_count; start += BLOCK) {  /* block by block, each loop one pass */
        Py_ssize_t n = a_count - start < BLOCK ? a_count - start : BLOCK;
        load_block((const char *)a + start, a_format, n, x);
        load_block((const char *)b + start, b_format, n, y);
        for (Py_ssize_t i = 0; i < n; i++) x[i] = (x[i] - a_shift) * a_scale;
        for (Py_ssize_t i = 0; i < n; i++) y[i] = (y[i] - b_shift) * b_scale;
        if (multiply)
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] * y[i];
        else
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] + y[i];
        if (relu)
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] < 0.0f ? 0.0f : x[i];
        quantize_block(x, n, scale, zero_point, qmin, qmax);
        store_block(x, n, (char *)out + start, out_format);
    }
    Py_END_ALLOW_THREADS
    release(&buffers);
    Py_RETURN_NONE;
fail:
    release(&buffers);
    return NULL;
}

static PyMethodDef methods[] = {
    {"output_stage", output_stage, METH_VARARGS, OUTPUT_STAGE_DOC},
    {"join", join, METH_VARARGS, JOIN_DOC},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_elementwise",
                                    "One-pass float32 chains of lpt's output stage and joins.", -1, methods};

PyMODINIT_FUNC PyInit__elementwise(void) { return PyModule_Create(&module); }
