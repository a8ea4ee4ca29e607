"""Spike: oneDNN 3.2 int8 convolution from Python - exactness and speed.

Run after ./build.sh, in the venv holding the oneDNN wheels and onnxruntime:
    OMP_NUM_THREADS=2 python bench/onednn/spike.py
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onednn_conv  # noqa: E402

THREADS = int(os.environ["OMP_NUM_THREADS"])


# ---------------------------------------------------------------- reference
def im2col_nchw(x, kh, kw, s, p, pad_value=0):
    """x [N,C,H,W] -> cols [N*OH*OW, C*KH*KW] (same dtype), plus OH, OW."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=pad_value)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::s, ::s]  # N,C,OH,OW,KH,KW
    oh, ow = win.shape[2], win.shape[3]
    cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
    return cols, oh, ow


def conv_ref(x, w, s, p, zp=0):
    """Exact int64 reference: sum((x - zp) * w), padding is 0 in the real
    domain (i.e. the padded u8 value equals the zero point)."""
    n = x.shape[0]
    oc, _, kh, kw = w.shape
    cols, oh, ow = im2col_nchw(x.astype(np.int64) - zp, kh, kw, s, p, 0)
    y = cols @ w.reshape(oc, -1).astype(np.int64).T
    return y.reshape(n, oh, ow, oc).transpose(0, 3, 1, 2)


# ---------------------------------------------------------------- oneDNN
class OneDNNConv:
    def __init__(self, w, in_shape, s, p, zp=0, src_dt="u8", sum_scale=0.0):
        n, c, h, wd = in_shape
        oc, ic, kh, kw = w.shape
        assert ic == c
        self.oshape = (n, (h + 2 * p - kh) // s + 1, (wd + 2 * p - kw) // s + 1, oc)
        t0 = time.perf_counter()
        self.cap = onednn_conv.create(src_dt, n, c, h, wd, np.ascontiguousarray(w, np.int8),
                                      oc, kh, kw, s, s, p, p, int(zp), float(sum_scale))
        self.create_s = time.perf_counter() - t0
        self.impl = onednn_conv.impl(self.cap)
        self.dst = np.empty(self.oshape, np.int32)

    def run_nhwc(self, x_nhwc, iters=1):
        return onednn_conv.run(self.cap, x_nhwc, self.dst, iters)

    def __call__(self, x_nchw):
        self.run_nhwc(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)))
        return self.dst.transpose(0, 3, 1, 2).astype(np.int64)


class SplitConv:
    """Exact u8 x s8 on a CPU without VNNI: w = 64*hi + lo with lo in [0, 63]
    and hi in [-2, 1]. Pair sums per half: 2*255*63 = 32130 <= 32767, so the
    int16 pair add (vpmaddubsw) cannot saturate. One primitive with 2*OC
    output channels [hi; lo], combined in int32: y = 64*y_hi + y_lo."""

    def __init__(self, w, in_shape, s, p, zp=0):
        w = w.astype(np.int16)
        hi = np.floor_divide(w, 64)
        lo = w - 64 * hi
        assert lo.min() >= 0 and lo.max() <= 63 and hi.min() >= -2 and hi.max() <= 1
        self.oc = w.shape[0]
        self.conv = OneDNNConv(np.concatenate([hi, lo]).astype(np.int8), in_shape, s, p, zp)
        self.impl = self.conv.impl
        self.out = np.empty(self.conv.oshape[:-1] + (self.oc,), np.int32)

    def run_nhwc(self, x_nhwc, iters=1):
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.conv.run_nhwc(x_nhwc)
            d = self.conv.dst
            np.multiply(d[..., : self.oc], 64, out=self.out)
            self.out += d[..., self.oc:]
            times.append(time.perf_counter() - t0)
        return times

    def __call__(self, x_nchw):
        self.run_nhwc(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)))
        return self.out.transpose(0, 3, 1, 2).astype(np.int64)


class TwoPassConv:
    """Same split, all in oneDNN: pass 1 conv(hi) -> dst (s32), pass 2 conv(lo)
    with a sum post-op of scale 64: dst = conv(lo) + 64 * dst. Post-ops run in
    f32, so this is exact only while |64*y_hi| and |y| stay below 2**24."""

    def __init__(self, w, in_shape, s, p, zp=0):
        w = w.astype(np.int16)
        hi = np.floor_divide(w, 64)
        lo = w - 64 * hi
        self.c_hi = OneDNNConv(hi.astype(np.int8), in_shape, s, p, zp)
        self.c_lo = OneDNNConv(lo.astype(np.int8), in_shape, s, p, zp, sum_scale=64.0)
        self.c_lo.dst = self.c_hi.dst  # same buffer: pass 2 accumulates onto pass 1
        self.impl = self.c_lo.impl
        self.dst = self.c_hi.dst

    def run_nhwc(self, x_nhwc, iters=1):
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.c_hi.run_nhwc(x_nhwc)
            self.c_lo.run_nhwc(x_nhwc)
            times.append(time.perf_counter() - t0)
        return times

    def __call__(self, x_nchw):
        self.run_nhwc(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)))
        return self.dst.transpose(0, 3, 1, 2).astype(np.int64)


def wrong_share(y, ref):
    bad = y != ref
    return bad.mean(), int(np.abs(y - ref).max())


# ---------------------------------------------------------------- exactness
def exactness():
    rng = np.random.default_rng(0)
    cases = []
    x = rng.integers(0, 256, (1, 64, 56, 56), dtype=np.uint8)
    w3 = rng.integers(-128, 128, (64, 64, 3, 3), dtype=np.int8)
    cases.append(("random 3x3 64->64 56x56 p1", x, w3, 1, 1, 0))
    cases.append(("random 3x3, src zp=128", x, w3, 1, 1, 128))
    x1 = rng.integers(0, 256, (1, 256, 56, 56), dtype=np.uint8)
    w1 = rng.integers(-128, 128, (64, 256, 1, 1), dtype=np.int8)
    cases.append(("random 1x1 256->64 56x56", x1, w1, 1, 0, 0))
    xe = np.full((1, 64, 56, 56), 255, np.uint8)
    we = rng.choice(np.array([-128, 127], np.int8), (64, 64, 3, 3))
    cases.append(("extreme: src 255, w in {-128,127}", xe, we, 1, 1, 0))
    cases.append(("extreme: src 255, w all 127", xe, np.full_like(we, 127), 1, 1, 0))
    cases.append(("extreme: src 255, w all -128", xe, np.full_like(we, -128), 1, 1, 0))
    cases.append(("random 3x3 stride 2 p1", x, w3, 2, 1, 0))

    print("\n== exactness (share of int32 outputs != exact int64 reference, max |diff|)")
    for name, x, w, s, p, zp in cases:
        ref = conv_ref(x, w, s, p, zp)
        c = OneDNNConv(w, x.shape, s, p, zp)
        f, m = wrong_share(c(x), ref)
        sp = SplitConv(w, x.shape, s, p, zp)
        fs, ms = wrong_share(sp(x), ref)
        tp = TwoPassConv(w, x.shape, s, p, zp)
        ft, mt = wrong_share(tp(x), ref)
        print(f"{name:36s} u8s8 [{c.impl}]: {100*f:6.2f}% wrong (max {m:7d}) | "
              f"split 2*OC: {100*fs:5.2f}% (max {ms}) | two-pass sum post-op: {100*ft:5.2f}% (max {mt})"
              f"  |ref|max={int(np.abs(ref).max())}")
    # s8 x s8: oneDNN's s8s8 path
    xs = rng.integers(-128, 128, (1, 64, 56, 56), dtype=np.int8)
    for name, xx, ww in [("s8s8 random 3x3", xs, w3),
                         ("s8s8 extreme: src -128, w {-128,127}", np.full_like(xs, -128), we)]:
        ref = conv_ref(xx, ww, 1, 1)
        c = OneDNNConv(ww, xx.shape, 1, 1, 0, src_dt="s8")
        f, m = wrong_share(c(xx), ref)
        print(f"{name:38s} s8s8 [{c.impl}]: {100*f:6.2f}% wrong (max {m})")


# ---------------------------------------------------------------- speed
def median_ms(times):
    return 1e3 * statistics.median(times)


def timeit(fn, iters=50, warm=5):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def ort_convinteger(x, w, s, p, zp):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    oc, ic, kh, kw = w.shape
    results = {}
    # (a) u8 x s8 weights;  (b) u8 x u8 weights (w + 128, w_zero_point = 128)
    for label, wq, wzp in [("u8s8", w, None), ("u8u8", (w.astype(np.int16) + 128).astype(np.uint8), 128)]:
        inits = [numpy_helper.from_array(wq, "W"),
                 numpy_helper.from_array(np.array(zp, np.uint8), "xzp")]
        ins = ["X", "W", "xzp"]
        if wzp is not None:
            inits.append(numpy_helper.from_array(np.array(wzp, np.uint8), "wzp"))
            ins.append("wzp")
        node = helper.make_node("ConvInteger", ins, ["Y"], kernel_shape=[kh, kw],
                                pads=[p] * 4, strides=[s, s])
        g = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("X", TensorProto.UINT8, list(x.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, None)], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        try:
            sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
            y = sess.run(None, {"X": x})[0]
        except Exception as e:  # noqa: BLE001
            results[label] = (None, None, f"{type(e).__name__}: {str(e)[:100]}")
            continue
        results[label] = (sess, y, None)
    return results


def numpy_f32(x_nhwc, w, s, p):
    """im2col on NHWC + f32 GEMM: a speed reference only (f32 holds integers
    exactly only up to 2**24, which these accumulators can exceed)."""
    n, h, wd, c = x_nhwc.shape
    oc, ic, kh, kw = w.shape
    wm = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw * ic, oc), np.float32)

    def run():
        xf = x_nhwc.astype(np.float32)
        if kh == 1 and kw == 1 and s == 1 and p == 0:
            cols = xf.reshape(-1, c)
        else:
            xp = np.pad(xf, ((0, 0), (p, p), (p, p), (0, 0)))
            win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::s, ::s]
            cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(-1, kh * kw * c)
        return cols @ wm

    return run


def speed():
    rng = np.random.default_rng(1)
    shapes = [("3x3 64->64 56x56", 64, 64, 3, 1, 1), ("1x1 256->64 56x56", 256, 64, 1, 1, 0)]
    print(f"\n== speed, batch 1, {THREADS} threads, median of 50 (execution only for oneDNN)")
    for name, c, oc, k, s, p in shapes:
        x = rng.integers(0, 256, (1, c, 56, 56), dtype=np.uint8)
        w = rng.integers(-128, 128, (oc, c, k, k), dtype=np.int8)
        xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        ref = conv_ref(x, w, s, p)
        oh = (56 + 2 * p - k) // s + 1
        macs = oh * oh * oc * c * k * k
        rows = []
        cv = OneDNNConv(w, x.shape, s, p)
        cv.run_nhwc(xh, 5)
        t = cv.run_nhwc(xh, 50)
        rows.append((f"oneDNN u8s8 [{cv.impl}] (create {1e3*cv.create_s:.1f} ms)", t,
                     wrong_share(cv(x), ref)[0]))
        sp = SplitConv(w, x.shape, s, p)
        sp.run_nhwc(xh, 5)
        t = sp.run_nhwc(xh, 50)
        rows.append((f"oneDNN split 2*OC + numpy combine [{sp.impl}]", t, wrong_share(sp(x), ref)[0]))
        t = sp.conv.run_nhwc(xh, 50)
        rows.append(("  of which the oneDNN 2*OC conv alone", t, None))
        tp = TwoPassConv(w, x.shape, s, p)
        tp.run_nhwc(xh, 5)
        t = tp.run_nhwc(xh, 50)
        rows.append((f"oneDNN two passes, sum post-op x64 [{tp.impl}]", t, wrong_share(tp(x), ref)[0]))
        for label, (sess, y, err) in ort_convinteger(x, w, s, p, 0).items():
            if err:
                rows.append((f"onnxruntime ConvInteger {label}: {err}", None, None))
                continue
            t = timeit(lambda: sess.run(None, {"X": x}))
            rows.append((f"onnxruntime ConvInteger {label} (NCHW, incl. session.run)", t,
                         wrong_share(y.astype(np.int64), ref)[0]))
        f = numpy_f32(xh, w, s, p)
        rows.append(("numpy f32 im2col + matmul (NHWC)", timeit(f), None))
        print(f"-- {name}: {macs/1e6:.1f} MMAC")
        for label, t, bad in rows:
            if t is None:
                print(f"   {label}")
                continue
            ms = median_ms(t)
            ex = "" if bad is None else f"  wrong {100*bad:.2f}%"
            print(f"   {ms:7.3f} ms  {macs/ms/1e6:7.1f} GMAC/s  {label}{ex}")


if __name__ == "__main__":
    import platform
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    print(f"CPU: {cpu}; avx512_vnni: {'avx512_vnni' in flags}; avx_vnni: {' avx_vnni' in flags}; "
          f"oneDNN {onednn_conv.version()[:3]}; numpy {np.__version__}; {platform.python_version()}")
    what = sys.argv[1:] or ["exact", "speed"]
    if "exact" in what:
        exactness()
    if "speed" in what:
        speed()
