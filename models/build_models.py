"""Train and export lpt's example ONNX models and their data.

Usage: python models/build_models.py [--out DIR]     (default: this folder)

Builds, from scikit-learn's bundled data sets only (no downloads):
  digits_cnn          plain Conv/Relu/MaxPool/Gemm classifier
  digits_zoo          the structures quantizers get wrong (residual Add, Concat,
                      depthwise Conv, pools, Clip, HardSwish, Sigmoid gate)
  digits_transformer  Gather embeddings, hand-written attention, LayerNorm, Erf gelu
  tabular_mlp         Gemm MLP on standardized breast-cancer features
  digits_cnn.ort_qdq  digits_cnn quantized by onnxruntime (QDQ)
  digits_cnn.ov_fq    digits_cnn with OpenVINO FakeQuantize nodes
and beside each fp32 model NAME.npz (calibration inputs) and NAME.test.npz
(test inputs + labels), then writes README.md with accuracies measured by
onnxruntime. This script imports torch: lpt's tests and runtime never run it.
"""

import argparse
import collections
import io
import os
import tempfile
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import helper, numpy_helper
from onnxruntime import quantization as ortq
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split

SEED = 0
OPSET = 17          # LayerNormalization needs >= 17
IR_VERSION = 8      # the oldest IR that carries opset 17; every onnxruntime since 1.14 loads it
N_CALIB = 300
OV_DOMAIN = "org.openvinotoolkit"


# ---------------------------------------------------------------- data

def digits_data():
    """load_digits split 70/30 (stratified); images upsampled to 16x16, raw pixels as tokens."""
    d = load_digits()
    train, test = train_test_split(np.arange(len(d.target)), test_size=0.3,
                                   random_state=SEED, stratify=d.target)
    pixels = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]    # [N,1,8,8] in [0,1]
    # Bilinear upsampling happens here, not in the model, so the model input is [N,1,16,16].
    images = F.interpolate(pixels, size=(16, 16), mode="bilinear", align_corners=False).numpy()
    return {
        "images": images.astype(np.float32),
        "tokens": d.images.reshape(-1, 64).astype(np.int64),                 # intensities 0..16
        "labels": d.target.astype(np.int64),
        # train_test_split already shuffled `train`, so its head is a random calibration subset.
        "train": train, "test": test, "calib": train[:N_CALIB],
    }


def breast_cancer_data():
    """load_breast_cancer split 70/30, standardized with the training split's statistics."""
    d = load_breast_cancer()
    train, test = train_test_split(np.arange(len(d.target)), test_size=0.3,
                                   random_state=SEED, stratify=d.target)
    mean = d.data[train].mean(axis=0)
    std = d.data[train].std(axis=0)
    features = ((d.data - mean) / std).astype(np.float32)
    return {"features": features, "labels": d.target.astype(np.int64),
            "train": train, "test": test, "calib": train[:N_CALIB]}


def save_data(out, name, input_name, inputs, labels, calib, test):
    # zip entries written by np.savez_compressed carry a fixed 1980 timestamp: reruns give equal bytes
    np.savez_compressed(os.path.join(out, f"{name}.npz"), **{input_name: inputs[calib]})
    np.savez_compressed(os.path.join(out, f"{name}.test.npz"),
                        **{input_name: inputs[test], "labels": labels[test]})


# ---------------------------------------------------------------- training

def train(model, inputs, labels, epochs, lr, batch=64, weight_decay=0.0, augment=None):
    """AdamW + cosine schedule over reshuffled minibatches, all from fixed seeds."""
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    x, y = torch.from_numpy(inputs), torch.from_numpy(labels)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            xb = augment(x[idx], gen) if augment else x[idx]
            loss = F.cross_entropy(model(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    model.eval()
    return model


def random_shift(images, gen):
    """Shift a batch of [.., H, W] grids by up to one pixel, filling with zeros (background)."""
    dy, dx = torch.randint(-1, 2, (2,), generator=gen).tolist()
    h, w = images.shape[-2:]
    padded = F.pad(images, (1, 1, 1, 1))
    return padded[..., 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]


# ---------------------------------------------------------------- export & checks

def export(model, example, path, input_name="input"):
    """Legacy TorchScript exporter: it still works in torch 2.13 and gives plain graphs
    (no local functions, constants folded, names like /conv1/Conv)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the legacy exporter's DeprecationWarning
        torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=OPSET,
                          do_constant_folding=True,
                          input_names=[input_name], output_names=["logits"],
                          dynamic_axes={input_name: {0: "N"}, "logits": {0: "N"}})
    model_proto = onnx.load_from_string(buf.getvalue())
    model_proto.ir_version = IR_VERSION    # pinned: the IR a writer picks follows its onnx version
    finish(model_proto, path)


def finish(model_proto, path):
    """Infer shapes once (kept as value_info), run the full checker, save as one file."""
    del model_proto.graph.value_info[:]
    model_proto = onnx.shape_inference.infer_shapes(model_proto, check_type=True,
                                                    strict_mode=True, data_prop=True)
    onnx.checker.check_model(model_proto, full_check=True)
    onnx.save(model_proto, path)
    size = os.path.getsize(path)
    assert size < 2 * 1024 * 1024, f"{path} is {size} bytes"


def op_histogram(path):
    return collections.Counter(n.op_type for n in onnx.load(path).graph.node)


def ort_logits(path, inputs):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], inputs)[0]


def test_accuracy(path, test_npz):
    """Top-1 of the model in onnxruntime on NAME.test.npz; returns (accuracy, logits)."""
    with np.load(test_npz) as d:
        labels = d["labels"]
        inputs = {k: d[k] for k in d.files if k != "labels"}
    logits = ort_logits(path, inputs)
    return float((logits.argmax(axis=1) == labels).mean()), logits


# ---------------------------------------------------------------- a. digits_cnn

class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(256, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def build_digits_cnn(out, data):
    torch.manual_seed(SEED)
    x, y = data["images"], data["labels"]
    model = train(DigitsCNN(), x[data["train"]], y[data["train"]], epochs=40, lr=5e-3,
                  weight_decay=0.05, augment=random_shift)
    export(model, torch.from_numpy(x[:1]), os.path.join(out, "digits_cnn.onnx"))
    save_data(out, "digits_cnn", "input", x, y, data["calib"], data["test"])


# ---------------------------------------------------------------- b. digits_zoo

class DigitsZoo(nn.Module):
    """Each block carries a pattern that needs care when quantizing: an Add and a Concat of
    branches with different ranges, a depthwise Conv, Clip (Relu6), HardSwish, a Sigmoid gate
    multiplied back into the activations, and average pools."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU6())              # Clip
        # residual: both Add operands come from convs
        self.res_a = nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU())
        self.res_b = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1))
        self.pool = nn.AvgPool2d(2)                                                        # AveragePool
        # concat of a pointwise branch and a depthwise-separable branch
        self.cat_a = nn.Sequential(nn.Conv2d(16, 8, 1), nn.ReLU())
        self.cat_b = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU6(),  # depthwise
                                   nn.Conv2d(16, 8, 1), nn.Hardswish())
        # squeeze-excite gate: GlobalAveragePool -> 1x1 -> Relu -> 1x1 -> Sigmoid -> Mul
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(16, 4, 1), nn.ReLU(),
                                nn.Conv2d(4, 16, 1), nn.Sigmoid())
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)                                  # [N,16,16,16]
        x = F.relu(self.res_a(x) + self.res_b(x))
        x = self.pool(x)                                  # [N,16,8,8]
        x = torch.cat([self.cat_a(x), self.cat_b(x)], dim=1)
        x = x * self.se(x)
        x = self.pool(x)                                  # [N,16,4,4]
        return self.fc(torch.flatten(x, 1))


def build_digits_zoo(out, data):
    torch.manual_seed(SEED)
    x, y = data["images"], data["labels"]
    model = train(DigitsZoo(), x[data["train"]], y[data["train"]], epochs=40, lr=5e-3,
                  weight_decay=0.05, augment=random_shift)
    path = os.path.join(out, "digits_zoo.onnx")
    export(model, torch.from_numpy(x[:1]), path)
    save_data(out, "digits_zoo", "input", x, y, data["calib"], data["test"])

    hist = op_histogram(path)
    grouped = [n for n in onnx.load(path).graph.node if n.op_type == "Conv" and
               any(a.name == "group" and a.i > 1 for a in n.attribute)]
    print("  digits_zoo ops:", dict(sorted(hist.items())))
    for op in ("Add", "Concat", "AveragePool", "GlobalAveragePool", "Clip", "HardSwish", "Sigmoid", "Mul"):
        assert hist[op] > 0, f"digits_zoo lost its {op}"
    assert grouped, "digits_zoo lost its depthwise Conv"


# ---------------------------------------------------------------- c. digits_transformer

class DigitsTransformer(nn.Module):
    """One pre-LN encoder block over the 64 pixels of an 8x8 digit as tokens. Attention is
    written with matmuls so it exports as MatMul/Softmax/Transpose, not a fused op.
    Without dropout it memorizes the 1257 training digits (100% train, ~85% test)."""

    def __init__(self, vocab=17, tokens=64, dim=32, heads=2, hidden=64, classes=10, dropout=0.2):
        super().__init__()
        self.tokens, self.dim, self.heads = tokens, dim, heads
        self.embed = nn.Embedding(vocab, dim)                        # Gather
        self.pos = nn.Parameter(0.02 * torch.randn(tokens, dim))     # Add of a [64,32] initializer
        self.ln1 = nn.LayerNorm(dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.gelu = nn.GELU()                                        # exact: Div/Erf/Add/Mul at opset 17
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.drop = nn.Dropout(dropout)                              # training only: not exported

    def split_heads(self, t):
        # -1 for the batch keeps the Reshape target a constant (no Shape subgraph in the export)
        return t.reshape(-1, self.tokens, self.heads, self.dim // self.heads).transpose(1, 2)

    def forward(self, tokens):
        x = self.drop(self.embed(tokens) + self.pos)                 # [N,64,32]
        h = self.ln1(x)
        q, k, v = self.split_heads(self.q(h)), self.split_heads(self.k(h)), self.split_heads(self.v(h))
        att = self.drop(torch.softmax(q @ k.transpose(-1, -2) * (self.dim // self.heads) ** -0.5, dim=-1))
        o = (att @ v).transpose(1, 2).reshape(-1, self.tokens, self.dim)
        x = x + self.drop(self.proj(o))
        x = x + self.drop(self.fc2(self.gelu(self.fc1(self.ln2(x)))))
        return self.head(self.ln_f(x).mean(dim=1))                  # ReduceMean over tokens


def build_digits_transformer(out, data):
    torch.manual_seed(SEED)
    x, y = data["tokens"], data["labels"]
    model = train(DigitsTransformer(), x[data["train"]], y[data["train"]], epochs=50, lr=1e-2,
                  weight_decay=0.1)
    export(model, torch.from_numpy(x[:1]), os.path.join(out, "digits_transformer.onnx"),
           input_name="tokens")
    save_data(out, "digits_transformer", "tokens", x, y, data["calib"], data["test"])


# ---------------------------------------------------------------- d. tabular_mlp

def build_tabular_mlp(out, data):
    torch.manual_seed(SEED)
    x, y = data["features"], data["labels"]
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
    model = train(model, x[data["train"]], y[data["train"]], epochs=30, lr=1e-3)
    export(model, torch.from_numpy(x[:1]), os.path.join(out, "tabular_mlp.onnx"))
    save_data(out, "tabular_mlp", "input", x, y, data["calib"], data["test"])


# ---------------------------------------------------------------- e1. onnxruntime QDQ

class NpzReader(ortq.CalibrationDataReader):
    def __init__(self, npz, batch=100):
        with np.load(npz) as d:
            x = d["input"]
        self.batches = iter([{"input": x[i:i + batch]} for i in range(0, len(x), batch)])

    def get_next(self):
        return next(self.batches, None)


def build_ort_qdq(out):
    src = os.path.join(out, "digits_cnn.onnx")
    dst = os.path.join(out, "digits_cnn.ort_qdq.onnx")
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "pre.onnx")
        q = os.path.join(tmp, "q.onnx")
        ortq.quant_pre_process(src, pre)       # ORT's recommended shape inference + cleanup
        ortq.quantize_static(pre, q, NpzReader(os.path.join(out, "digits_cnn.npz")),
                             quant_format=ortq.QuantFormat.QDQ, per_channel=True,
                             activation_type=ortq.QuantType.QUInt8, weight_type=ortq.QuantType.QInt8,
                             calibrate_method=ortq.CalibrationMethod.MinMax)
        model = onnx.load(q)
    # quant_pre_process saves every domain ORT's optimizer knows (com.microsoft, ai.onnx.ml,
    # org.pytorch.aten, ...) as opset imports; keep only the ones nodes use
    used = {n.domain for n in model.graph.node} | {""}
    kept = [o for o in model.opset_import if o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    model.ir_version = IR_VERSION
    finish(model, dst)


# ---------------------------------------------------------------- e2. OpenVINO FakeQuantize

def activation_ranges(model, names, calib_npz):
    """min/max of the given tensors over the calibration data, from the fp32 model in ORT
    with those tensors exposed as extra graph outputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {vi.name: vi for vi in list(probe.graph.value_info) + list(probe.graph.input)}
    probe.graph.output.extend(known[n] for n in names)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    with np.load(calib_npz) as d:
        values = sess.run(names, {"input": d["input"]})
    return {n: (float(v.min()), float(v.max())) for n, v in zip(names, values)}


def build_ov_fq(out):
    """digits_cnn with FakeQuantize (org.openvinotoolkit) on every Conv/Gemm activation input
    (256 levels, per tensor) and weight (255 levels, per output channel, symmetric)."""
    model = onnx.load(os.path.join(out, "digits_cnn.onnx"))
    graph = model.graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    acts = list(dict.fromkeys(n.input[0] for n in graph.node if n.op_type in ("Conv", "Gemm")))
    ranges = activation_ranges(model, acts, os.path.join(out, "digits_cnn.npz"))

    limits, nodes, fq_out = [], [], {}

    def fake_quantize(tensor, low, high, levels):
        name = tensor + "/fq"
        lo = numpy_helper.from_array(low.astype(np.float32), name + "/low")
        hi = numpy_helper.from_array(high.astype(np.float32), name + "/high")
        limits.extend([lo, hi])
        fq_out[tensor] = name
        # output limits = input limits: the FQ only rounds, it does not rescale
        return helper.make_node("FakeQuantize", [tensor, lo.name, hi.name, lo.name, hi.name], [name],
                                name=tensor + "/FakeQuantize", domain=OV_DOMAIN, levels=levels)

    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)       # copies: graph.node is cleared below
        if node.op_type in ("Conv", "Gemm"):
            act, w = node.input[0], node.input[1]
            if act not in fq_out:
                lo, hi = ranges[act]
                # keep 0 inside the range; this makes low exactly 0 for non-negative tensors
                # (the [0,1] input, Relu/MaxPool outputs) as an unsigned u8 range expects
                nodes.append(fake_quantize(act, np.array(min(lo, 0.0)), np.array(max(hi, 0.0)), 256))
            wv = weights[w]
            # output channels are dim 0 for Conv and for Gemm with transB=1 (torch's Linear)
            trans_b = node.op_type == "Conv" or any(a.name == "transB" and a.i for a in node.attribute)
            oc_axis = 0 if trans_b else 1
            amax = np.abs(np.moveaxis(wv, oc_axis, 0)).reshape(wv.shape[oc_axis], -1).max(axis=1)
            assert (amax > 0).all(), f"{w} has an all-zero output channel"
            shape = [1] * wv.ndim
            shape[oc_axis] = wv.shape[oc_axis]
            nodes.append(fake_quantize(w, -amax.reshape(shape), amax.reshape(shape), 255))
            node.input[0], node.input[1] = fq_out[act], fq_out[w]
        nodes.append(node)

    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(limits)
    model.opset_import.append(helper.make_opsetid(OV_DOMAIN, 1))
    # onnx knows no FakeQuantize schema, so give its outputs the shape of their X by hand
    types = {vi.name: vi.type for vi in list(graph.value_info) + list(graph.input)}
    types.update({t.name: helper.make_tensor_type_proto(t.data_type, t.dims) for t in graph.initializer})
    for x, y in fq_out.items():
        graph.value_info.append(helper.make_value_info(y, types[x]))
    onnx.checker.check_model(model, full_check=True)   # skips the unknown domain's nodes
    path = os.path.join(out, "digits_cnn.ov_fq.onnx")
    onnx.save(model, path)
    assert os.path.getsize(path) < 2 * 1024 * 1024


def openvino_accuracy(out, fp32_logits):
    """Top-1 of digits_cnn.ov_fq.onnx in OpenVINO (CPU, f32 inference precision so only the
    FakeQuantizes differ from fp32) and its max |logit - fp32 logit|; None without openvino."""
    try:
        import openvino
    except ImportError:
        return None
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(os.path.join(out, "digits_cnn.ov_fq.onnx")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    with np.load(os.path.join(out, "digits_cnn.test.npz")) as d:
        logits = compiled(d["input"])[compiled.output(0)]
        acc = float((logits.argmax(axis=1) == d["labels"]).mean())
    return acc, float(np.abs(logits - fp32_logits).max()), openvino.__version__.split("-")[0]


# ---------------------------------------------------------------- README

MODELS = [
    # file, task, input name
    ("digits_cnn.onnx", "load_digits 16x16, 10 classes", "input"),
    ("digits_zoo.onnx", "load_digits 16x16, 10 classes", "input"),
    ("digits_transformer.onnx", "load_digits 8x8 pixels as tokens, 10 classes", "tokens"),
    ("tabular_mlp.onnx", "load_breast_cancer, 30 standardized features, 2 classes", "input"),
    ("digits_cnn.ort_qdq.onnx", "digits_cnn, onnxruntime quantize_static QDQ", "input"),
    ("digits_cnn.ov_fq.onnx", "digits_cnn, OpenVINO FakeQuantize", "input"),
]


def input_shape(path, name):
    vi = next(i for i in onnx.load(path).graph.input if i.name == name)
    t = vi.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) for d in t.shape.dim]
    return f"{helper.tensor_dtype_to_np_dtype(t.elem_type).name} [{','.join(dims)}]"


def write_readme(out, rows, ov):
    lines = [
        "# Example models",
        "",
        "Built by `python models/build_models.py [--out DIR]` (needs torch, scikit-learn, onnx,",
        "onnxruntime; only run by hand: lpt's tests and runtime never import torch). Training is",
        "seeded and deterministic; data comes from scikit-learn's bundled data sets.",
        "",
        f"All models: opset {OPSET}, IR version {IR_VERSION}, float32 (the transformer's input is",
        "int64 tokens), batch dim `N`, one output `logits`, weights as initializers, shape-inferred",
        "`value_info`. The fp32 ones come from torch's legacy TorchScript exporter",
        "(`dynamo=False`, constant folding on): plain ONNX ops, no functions. Scalars and Reshape",
        "targets stay `Constant` nodes as the exporter writes them. In the transformer the",
        "Reshapes to `[-1,64,...]` make onnx shape inference lose the name `N`: tensors after",
        "them have batch dims `unk__k`.",
        "",
        f"Written with torch {torch.__version__}, onnx {onnx.__version__}, "
        f"onnxruntime {ort.__version__}.",
        "",
        "| file | task | ops | input | test top-1 (onnxruntime) | size |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for file, task, ops, shape, acc, size in rows:
        lines.append(f"| `{file}` | {task} | {ops} | `{shape}` | {acc} | {size / 1024:.1f} KiB |")
    lines += [
        "",
        "Data beside each fp32 model `NAME.onnx`:",
        "",
        f"- `NAME.npz`: {N_CALIB} calibration inputs from the training split, keyed by input name",
        "  (`input`, or `tokens` for the transformer); usable directly as `--data`.",
        "- `NAME.test.npz`: the held-out test split (30%, never trained on): inputs keyed by",
        "  input name, plus `labels` (int64).",
        "",
        "`digits_cnn.ort_qdq.onnx` and `digits_cnn.ov_fq.onnx` use `digits_cnn`'s data.",
        "",
        "- `digits_cnn.ort_qdq.onnx`: `quant_pre_process`, then `quantize_static` with a",
        "  MinMax-calibrated reader over `digits_cnn.npz`, `QuantFormat.QDQ`, `per_channel=True`,",
        "  activations `QUInt8`, weights `QInt8`. ORT drops the Relus: a Conv/Gemm output goes",
        "  straight into a QuantizeLinear with uint8 zero point 0, whose saturation is the Relu.",
        "  Bias is int32 with its own DequantizeLinear; the logits are quantized too.",
        "- `digits_cnn.ov_fq.onnx`: `FakeQuantize` nodes (domain `org.openvinotoolkit`, version 1,",
        "  limits as initializers) on every Conv/Gemm activation input (levels 256, per tensor,",
        "  calibration min/max with 0 kept inside the range, so low = 0 for non-negative tensors)",
        "  and weight (levels 255, per output channel, symmetric +-max|w|, limits `[OC,1,1,1]` /",
        "  `[OC,1]`); output limits equal input limits; the fp32 weights stay as X. onnxruntime",
        "  cannot run it (unknown domain).",
    ]
    if ov:
        acc, diff, version = ov
        lines.append(f"  OpenVINO {version} (CPU, f32 precision hint): test top-1 {100 * acc:.2f}%, "
                     f"max |logit - fp32 logit| = {diff:.4f}.")
    else:
        lines.append("  (openvino was not installed when this README was written: not run.)")
    lines.append("")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


# ---------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    digits = digits_data()
    for name, build in [("digits_cnn", build_digits_cnn), ("digits_zoo", build_digits_zoo),
                        ("digits_transformer", build_digits_transformer)]:
        print(f"building {name}")
        build(out, digits)
    print("building tabular_mlp")
    build_tabular_mlp(out, breast_cancer_data())
    print("building digits_cnn.ort_qdq")
    build_ort_qdq(out)
    print("building digits_cnn.ov_fq")
    build_ov_fq(out)

    rows, fp32_cnn_logits = [], None
    for file, task, input_name in MODELS:
        path = os.path.join(out, file)
        stem = file.split(".")[0]
        if file.endswith("ov_fq.onnx"):
            acc = "not runnable (see below)"
        else:
            top1, logits = test_accuracy(path, os.path.join(out, f"{stem}.test.npz"))
            if file == "digits_cnn.onnx":
                fp32_cnn_logits = logits
            acc = f"{100 * top1:.2f}%"
        hist = op_histogram(path)
        ops = ", ".join(f"{op} {n}" for op, n in sorted(hist.items()))
        print(f"  {file}: top-1 {acc}; ops {ops}")
        rows.append((file, task, ops, input_shape(path, input_name), acc, os.path.getsize(path)))

    ov = openvino_accuracy(out, fp32_cnn_logits)
    print("  digits_cnn.ov_fq.onnx in OpenVINO:",
          f"top-1 {100 * ov[0]:.2f}%, max |diff to fp32| {ov[1]:.4f}" if ov else "openvino not installed")
    write_readme(out, rows, ov)


if __name__ == "__main__":
    main()
