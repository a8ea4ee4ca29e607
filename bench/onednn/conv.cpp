// Spike: oneDNN 3.2 int8 2-D convolution from Python (plain CPython C API).
//
// Module `onednn_conv`:
//   create(src_dt, N, C, H, W, weights, OC, KH, KW, sh, sw, ph, pw, src_zp) -> capsule
//       src_dt: "u8" or "s8"; weights: C-contiguous int8 buffer [OC, C, KH, KW] (oihw);
//       src_zp: int, 0 = no zero-point attribute.
//       optional sum_scale (float): append a sum post-op, dst = conv + sum_scale * dst.  Creates the primitive (src nhwc,
//       weights format_tag::any reordered once, dst s32 nhwc) and keeps it.
//   run(capsule, src, dst, iters) -> list of per-iteration seconds
//       src: C-contiguous uint8/int8 buffer in NHWC [N, H, W, C];
//       dst: writable C-contiguous int32 buffer NHWC [N, OH, OW, OC].
//       Zero-copy: the buffers are bound with set_data_handle.
//   impl(capsule) -> implementation name chosen by oneDNN (impl_info_str)
//   weights_desc(capsule) -> string describing the weights layout chosen
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

static engine &eng() {
    static engine e(engine::kind::cpu, 0);
    return e;
}
static stream &strm() {
    static stream s(eng());
    return s;
}

struct Conv {
    convolution_forward prim;
    memory src_mem, wei_mem, dst_mem, zp_mem;
    bool has_zp = false;
    size_t src_bytes = 0, dst_bytes = 0;
    std::string impl;
};

static void conv_free(PyObject *cap) {
    delete static_cast<Conv *>(PyCapsule_GetPointer(cap, "onednn_conv.Conv"));
}

static PyObject *py_create(PyObject *, PyObject *args) {
    const char *src_dt_s;
    long N, C, H, W, OC, KH, KW, sh, sw, ph, pw, zp;
    double sum_scale = 0.0;
    Py_buffer wbuf;
    if (!PyArg_ParseTuple(args, "slllly*llllllll|d", &src_dt_s, &N, &C, &H, &W, &wbuf,
                          &OC, &KH, &KW, &sh, &sw, &ph, &pw, &zp, &sum_scale))
        return nullptr;
    std::unique_ptr<Conv> c(new Conv);
    try {
        if ((long)wbuf.len != OC * C * KH * KW)
            throw std::runtime_error("weights buffer size mismatch");
        dt sdt = std::string(src_dt_s) == "s8" ? dt::s8 : dt::u8;
        long OH = (H + 2 * ph - KH) / sh + 1, OW = (W + 2 * pw - KW) / sw + 1;
        memory::desc src_md({N, C, H, W}, sdt, tag::nhwc);
        memory::desc wei_any({OC, C, KH, KW}, dt::s8, tag::any);
        memory::desc dst_md({N, OC, OH, OW}, dt::s32, tag::nhwc);
        primitive_attr attr;
        if (zp != 0) {
            attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
            c->has_zp = true;
        }
        if (sum_scale != 0.0) {  // dst = conv + sum_scale * dst (post-ops run in f32)
            post_ops po;
            po.append_sum((float)sum_scale);
            attr.set_post_ops(po);
        }
        auto pd = convolution_forward::primitive_desc(
                eng(), prop_kind::forward_inference, algorithm::convolution_direct,
                src_md, wei_any, dst_md, {sh, sw}, {ph, pw}, {ph, pw}, attr);
        c->impl = pd.impl_info_str();
        c->prim = convolution_forward(pd);
        // weights: user oihw -> chosen layout, once
        memory user_w({{OC, C, KH, KW}, dt::s8, tag::oihw}, eng(), wbuf.buf);
        c->wei_mem = memory(pd.weights_desc(), eng());
        reorder(user_w, c->wei_mem).execute(strm(), user_w, c->wei_mem);
        strm().wait();
        c->src_mem = memory(pd.src_desc(), eng(), nullptr);
        c->dst_mem = memory(pd.dst_desc(), eng(), nullptr);
        c->src_bytes = pd.src_desc().get_size();
        c->dst_bytes = pd.dst_desc().get_size();
        if (c->has_zp) {
            c->zp_mem = memory({{1}, dt::s32, tag::x}, eng());
            *static_cast<int32_t *>(c->zp_mem.get_data_handle()) = (int32_t)zp;
        }
    } catch (std::exception &e) {
        PyBuffer_Release(&wbuf);
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    PyBuffer_Release(&wbuf);
    return PyCapsule_New(c.release(), "onednn_conv.Conv", conv_free);
}

static PyObject *py_run(PyObject *, PyObject *args) {
    PyObject *cap;
    Py_buffer sbuf, dbuf;
    long iters = 1;
    if (!PyArg_ParseTuple(args, "Oy*w*|l", &cap, &sbuf, &dbuf, &iters)) return nullptr;
    Conv *c = static_cast<Conv *>(PyCapsule_GetPointer(cap, "onednn_conv.Conv"));
    std::vector<double> times;
    std::string err;
    if (!c) err = "bad capsule";
    else if ((size_t)sbuf.len != c->src_bytes || (size_t)dbuf.len != c->dst_bytes)
        err = "src/dst buffer size mismatch";
    if (err.empty()) {
        Py_BEGIN_ALLOW_THREADS;
        try {
            c->src_mem.set_data_handle(sbuf.buf);
            c->dst_mem.set_data_handle(dbuf.buf);
            std::unordered_map<int, memory> a{{DNNL_ARG_SRC, c->src_mem},
                    {DNNL_ARG_WEIGHTS, c->wei_mem}, {DNNL_ARG_DST, c->dst_mem}};
            if (c->has_zp) a[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = c->zp_mem;
            for (long i = 0; i < iters; ++i) {
                auto t0 = std::chrono::steady_clock::now();
                c->prim.execute(strm(), a);
                strm().wait();
                auto t1 = std::chrono::steady_clock::now();
                times.push_back(std::chrono::duration<double>(t1 - t0).count());
            }
        } catch (std::exception &e) { err = e.what(); }
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&sbuf);
    PyBuffer_Release(&dbuf);
    if (!err.empty()) {
        PyErr_SetString(PyExc_RuntimeError, err.c_str());
        return nullptr;
    }
    PyObject *out = PyList_New((Py_ssize_t)times.size());
    for (size_t i = 0; i < times.size(); ++i)
        PyList_SET_ITEM(out, (Py_ssize_t)i, PyFloat_FromDouble(times[i]));
    return out;
}

static PyObject *py_impl(PyObject *, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return nullptr;
    Conv *c = static_cast<Conv *>(PyCapsule_GetPointer(cap, "onednn_conv.Conv"));
    if (!c) return nullptr;
    return PyUnicode_FromString(c->impl.c_str());
}

static PyObject *py_version(PyObject *, PyObject *) {
    const dnnl_version_t *v = dnnl_version();
    return Py_BuildValue("(iiis)", v->major, v->minor, v->patch, v->hash);
}

static PyMethodDef methods[] = {
        {"create", py_create, METH_VARARGS, "create a u8/s8 x s8 -> s32 conv"},
        {"run", py_run, METH_VARARGS, "run(cap, src_nhwc, dst_nhwc, iters) -> times"},
        {"impl", py_impl, METH_VARARGS, "implementation name"},
        {"version", py_version, METH_NOARGS, "oneDNN version"},
        {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "onednn_conv", nullptr, -1, methods};

PyMODINIT_FUNC PyInit_onednn_conv(void) { return PyModule_Create(&mod); }
