"""u8 × s8 sums as AVX2 computes them without VNNI: pairs of products saturated to int16, then added in int32.

    acc[m, n] = Σ_j sat16(a[m, 2j]·b[2j, n] + a[m, 2j+1]·b[2j+1, n]) − za·Σ_k b[k, n]

This is onnxruntime's MLAS u8×s8 kernel on an AVX2 CPU (QgemmU8X8KernelAvx2, QgemvU8S8KernelAvx2,
ConvSymKernelAvx2): `vpbroadcastd` takes four consecutive bytes of a row of A, B is packed with
four consecutive k of a column side by side, `vpmaddubsw` multiplies u8 by s8 and adds the products
of k = 2j and 2j + 1 into an int16 with saturation, and `vpmaddwd` by 1 widens those to int32
exactly. So which products pair is fixed by the order of the reduction axis K as MLAS sees it:

- MatMulInteger, QLinearMatMul, MatMulIntegerToFloat, QGemm: K as in the model. K is padded to a
  multiple of 4 with zeros, so an odd K's last product pairs with 0.
- QLinearConv: onnxruntime transposes the input to NHWC and gathers im2col rows in
  the order (kernel position, input channel), channels innermost, one GEMM per group; the padded
  border holds the input's zero point (raw), which takes part in pairs like any input. Its
  indirect "ConvSym" kernel (symmetric weights, IC % 4 = 0, OC % 8 = 0, OC ≥ 16) reads the same
  pairs: with IC a multiple of 4, a pair never spans two kernel positions.
- The saturated quantity is the raw product a·b, a the stored u8 (not a − za): MLAS subtracts
  za·Σb afterwards, exactly.

Measured on a Zen 3 with onnxruntime 1.32 (tests/test_saturating_kernel.py checks it bit for bit
where onnxruntime saturates): s8 × s8 and u8 × u8 are exact, and so are ConvInteger and depthwise
QLinearConv (one input and one output channel per group: their kernels do not pair products).

The fast form: a pair can saturate only where both weights have the same sign and
|b0| + |b1| ≥ 129 (255·128 = 32 640 < 2^15 − 1), a property of the weights alone (a narrower
`limit`, the overflow fix's margin, takes the same test: 255·max(Σ b⁺, Σ |b⁻|) > limit). So the
result is the exact accumulator plus, on those few pairs, the correction sat16(p) − p:
`PairSaturation` finds them once per weight matrix and `corrections` computes them for given rows
of A (`ConvPairSaturation` for a convolution's im2col rows, gathering only the columns they read).
Only rows whose a0 + a1 pass a bound form sums, and those a column pair at a time on their distinct
(a0, a1) values (u8 pairs: a first layer's 145 000 rows hold a few thousand), the corrections then
gathered to the rows, with no array of the output's size per pair or per kernel position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lpt.kernels.window import Window

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
ROWS_PER_BLOCK = 4096  # at least this many rows of A are screened at once
PAIRS_PER_GROUP = 2000  # below this many sums per column pair, `accumulate` forms them all at once
SCREEN_BUDGET = 16 << 20  # bytes of screening sums (rows × column pairs) at once: bounds the scratch memory


@dataclass(frozen=True, eq=False)  # eq=False: ndarray fields have no boolean ==
class PairSaturation:
    """The pairs (k = 2j, 2j + 1) of a constant int8 B [K, N] whose int16 sum can saturate for some u8 row.

    `first[p]` is the pair's first k, `column[p]` its column n, `weights[p]` (b[2j, n], b[2j+1, n]).
    """

    first: np.ndarray  # int64 [P]
    column: np.ndarray  # int64 [P]
    weights: np.ndarray  # int32 [P, 2]
    reduction: int  # K
    columns: int  # N
    limit: int = INT16_MAX  # pair sums saturate to [−limit − 1, limit]

    @classmethod
    def of(cls, b: np.ndarray, limit: int = INT16_MAX) -> PairSaturation:
        """The risky pairs of `b`. A `limit` below 2^15 − 1 emulates a narrower accumulator: a margin
        (the overflow fix asks which channels come within it)."""
        b = np.asarray(b)
        if b.ndim != 2 or b.dtype != np.int8:
            raise ValueError(f"B must be int8 [K, N], got {b.dtype} {b.shape}")
        k, n = b.shape
        padded = np.zeros((k + k % 2, n), np.int32)
        padded[:k] = b
        low, high = padded[0::2], padded[1::2]  # [K/2, N]
        # The largest |a0·b0 + a1·b1| over u8 a is 255 times the larger of the positive weights' sum and the
        # negative weights' |sum|: past the limit only where both share a sign and |b0| + |b1| ≥ 129 (int16).
        positive = np.maximum(low, 0) + np.maximum(high, 0)
        negative = np.maximum(-low, 0) + np.maximum(-high, 0)
        risky = 255 * np.maximum(positive, negative) > limit
        column, pair = np.nonzero(risky.T)  # column-major: sorted by column
        return cls(first=2 * pair.astype(np.int64), column=column.astype(np.int64),
                   weights=np.stack([low[pair, column], high[pair, column]], axis=1).astype(np.int32),
                   reduction=k, columns=n, limit=int(limit))

    @property
    def count(self) -> int:
        return len(self.first)

    def corrections(self, a: np.ndarray, peaks: np.ndarray | None = None) -> np.ndarray:
        """Σ over the risky pairs of column n of sat16(p) − p, p = a[m, 2j]·b[2j, n] + a[m, 2j+1]·b[2j+1, n]:
        int32 [M, N], what the saturating kernel adds to the exact accumulator. `a` is u8 [M, K].
        `peaks` [N], if given, is raised in place to the largest |p| of each column where one passes the
        limit (see `corrections_at`)."""
        a = np.asarray(a)
        if a.dtype != np.uint8 or a.ndim != 2 or a.shape[1] != self.reduction:
            raise ValueError(f"A must be uint8 [M, {self.reduction}], got {a.dtype} {a.shape}")
        if self.reduction % 2:  # the last k pairs with MLAS's zero padding
            a = np.concatenate([a, np.zeros((a.shape[0], 1), np.uint8)], axis=1)
        return self.corrections_at(a, self.first, peaks)

    def corrections_at(self, a: np.ndarray, first: np.ndarray, peaks: np.ndarray | None = None) -> np.ndarray:
        """`corrections` where pair p reads columns first[p] and first[p] + 1 of u8 `a` (a gathered subset of A).

        Rows are screened a column pair at a time (see `screen`): only the few whose a0 + a1 could
        take a pair sum past the limit form their sums."""
        out = np.zeros((a.shape[0], self.columns), np.int32)
        if not self.count:
            return out
        screen = self.screen(first)
        block = max(ROWS_PER_BLOCK, SCREEN_BUDGET // (4 * len(screen.firsts)))  # the sums below: [block, J] int32
        for begin in range(0, a.shape[0], block):
            rows = a[begin:begin + block]
            sums = np.add(rows[:, screen.firsts], rows[:, screen.firsts + 1], dtype=np.int32)  # [rows, J]
            row, group = np.nonzero(sums > screen.bound)
            first_of = screen.firsts[group]
            self.accumulate(out[begin:begin + len(rows)], screen, row, group, rows[row, first_of],
                            rows[row, first_of + 1], peaks)
        return out

    def screen(self, first: np.ndarray) -> Screen:
        """The pairs grouped by the column pair (first, first + 1) of A they read, and per group the
        bound: (a0 + a1)·max(|b0|, |b1|) bounds every pair sum of the group, so rows with a0 + a1 at
        most limit // max(|b|) cannot pass the limit. Activations are mostly far below it."""
        order = np.argsort(first, kind="stable")
        firsts, begins, counts = np.unique(first[order], return_index=True, return_counts=True)
        heaviest = np.maximum.reduceat(np.abs(self.weights[order]).max(axis=1), begins)
        return Screen(order, firsts, begins, counts, self.limit // heaviest)

    def accumulate(self, out: np.ndarray, screen: Screen, row: np.ndarray, group: np.ndarray, a0: np.ndarray,
                   a1: np.ndarray, peaks: np.ndarray | None = None) -> None:
        """Add to out [rows, N] the corrections of the rows `row` that passed `screen` for column pairs
        `group`, whose two activations are a0 and a1: every pair of the group is formed for them.
        `peaks` [N] is raised to the largest |p| past the limit, per column.

        A group at a time, on the distinct (a0, a1) of its rows: a pair sum depends on nothing else,
        and a layer's many rows take few distinct values (u8 pairs), so the sums, their corrections
        and the peaks are formed once per value and the corrections gathered to the rows that hit.
        A group's pairs have distinct columns and its rows are distinct, so no two writes collide."""
        if not row.size:
            return
        repeat = screen.counts[group]
        if repeat.sum() < PAIRS_PER_GROUP * np.count_nonzero(np.bincount(group)):  # few rows: every pair at once
            self._accumulate_pairs(out, screen, row, group, a0, a1, repeat, peaks)
            return
        order = np.argsort(group, kind="stable")
        groups, begins = np.unique(group[order], return_index=True)
        ends = np.append(begins[1:], len(order))
        codes = (a0.astype(np.int32) << 8) | a1.astype(np.int32)  # the pair (a0, a1) as one integer
        for g, begin, end in zip(groups.tolist(), begins.tolist(), ends.tolist()):
            members = order[begin:end]
            pairs = screen.order[screen.begins[g]:screen.begins[g] + screen.counts[g]]
            values, inverse = _distinct(codes[members])
            sums = ((values >> 8)[:, None] * self.weights[pairs, 0] + (values & 255)[:, None] * self.weights[pairs, 1])
            past = np.abs(sums) > self.limit  # −limit − 1 itself is in range: its correction is 0
            if not past.any():
                continue
            columns = self.column[pairs]
            if peaks is not None:
                peaks[columns] = np.maximum(peaks[columns], np.where(past, np.abs(sums), 0).max(axis=0))
            hitting = np.flatnonzero(past.any(axis=1))
            table = np.zeros((len(hitting) + 1, self.columns), np.int32)  # a row of corrections per value; last: none
            table[:-1, columns] = np.clip(sums[hitting], -self.limit - 1, self.limit) - sums[hitting]
            lookup = np.full(len(values), len(hitting), np.intp)
            lookup[hitting] = np.arange(len(hitting))
            index = lookup[inverse]
            if 4 * len(members) > len(out):  # most rows: gather a row for each, and add without a scatter
                every = np.full(len(out), len(hitting), np.intp)
                every[row[members]] = index
                out += np.take(table, every, axis=0)
            else:
                hit = index < len(hitting)
                out[row[members[hit]]] += table[index[hit]]


    def _accumulate_pairs(self, out, screen, row, group, a0, a1, repeat, peaks) -> None:
        """`accumulate` for few rows: each row's pairs of its group formed side by side in one array (a
        loop over groups would cost more than the sums), the corrections added where they pass."""
        offsets = np.arange(int(repeat.sum())) - np.repeat(np.cumsum(repeat) - repeat, repeat)
        index = screen.order[np.repeat(screen.begins[group], repeat) + offsets]
        row = np.repeat(row, repeat)
        pair = (np.repeat(a0, repeat).astype(np.int32) * self.weights[index, 0]
                + np.repeat(a1, repeat).astype(np.int32) * self.weights[index, 1])  # |p| < 2^17
        past = np.abs(pair) > self.limit  # −limit − 1 itself is in range: its correction is 0
        if not past.any():
            return
        row, column, pair = row[past], self.column[index[past]], pair[past]
        if peaks is not None:
            np.maximum.at(peaks, column, np.abs(pair))
        np.add.at(out, (row, column), np.clip(pair, -self.limit - 1, self.limit) - pair)  # `out` may be a strided view


def _distinct(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values of int32 `codes` in [0, 2^16), the index of each code among them)."""
    if len(codes) < 1 << 14:
        return np.unique(codes, return_inverse=True)
    present = np.flatnonzero(np.bincount(codes, minlength=1 << 16))
    lookup = np.zeros(1 << 16, np.int64)
    lookup[present] = np.arange(len(present))
    return present.astype(np.int32), lookup[codes]


@dataclass(frozen=True, eq=False)
class Screen:
    """PairSaturation.screen: pair indices `order` grouped by column pair, the groups' first columns,
    where each group starts in `order` and how many pairs it has, and its bound on a0 + a1."""

    order: np.ndarray
    firsts: np.ndarray
    begins: np.ndarray
    counts: np.ndarray
    bound: np.ndarray


def saturating_matmul(a: np.ndarray, a_zero_point, b: np.ndarray) -> np.ndarray:
    """Σ_k (a − za)·b as MLAS's u8 × s8 AVX2 kernel computes it: int64 [..., M, N] for u8 a [..., M, K], int8 b [K, N]."""
    a = np.asarray(a)
    exact = np.matmul(a.astype(np.int64) - int(a_zero_point), np.asarray(b).astype(np.int64))
    rows = a.reshape(-1, a.shape[-1])
    return exact + PairSaturation.of(b).corrections(rows).reshape(exact.shape)


@dataclass(frozen=True, eq=False)
class ConvPairSaturation:
    """The risky pairs of a convolution's weights [OC, IC/g, *kernel], per group, in onnxruntime's im2col order."""

    groups: tuple[PairSaturation, ...]  # none for a depthwise convolution: exact
    in_channels: int  # per group
    out_channels: int
    window: Window

    @classmethod
    def of(cls, weights: np.ndarray, groups: int = 1, strides=None, dilations=None, pads=None,
           auto_pad: str = "NOTSET", limit: int = INT16_MAX) -> ConvPairSaturation:
        weights = np.asarray(weights)
        if weights.ndim < 3 or weights.shape[0] % groups:
            raise ValueError(f"weights of shape {weights.shape} do not fit a convolution with {groups} groups")
        out_per_group = weights.shape[0] // groups
        per_group = []
        depthwise = weights.shape[1] == 1 and out_per_group == 1  # onnxruntime's depthwise kernels do not pair
        for g in range(0 if depthwise else groups):
            w = weights[g * out_per_group:(g + 1) * out_per_group]
            # [OC/g, C, *kernel] → [(*kernel, C), OC/g]: kernel position outermost, channel innermost (NHWC im2col).
            b = np.moveaxis(w, 1, -1).reshape(out_per_group, -1).T
            per_group.append(PairSaturation.of(np.ascontiguousarray(b), limit))
        return cls(tuple(per_group), weights.shape[1], weights.shape[0], Window.of(weights.shape[2:], strides, dilations, pads, auto_pad))

    @property
    def count(self) -> int:
        return sum(p.count for p in self.groups)

    def corrections(self, src_q: np.ndarray, src_zero_point: int, peaks: np.ndarray | None = None) -> np.ndarray:
        """What the saturating kernel adds to the exact accumulator: int32 [N, OC, *out], for u8 src_q [N, C, *spatial].
        `peaks` [OC], if given, is raised in place to the largest |pair sum| of each channel where one
        passes the limit."""
        src_q = np.asarray(src_q)
        if src_q.dtype != np.uint8:
            raise ValueError(f"the saturating kernel takes a uint8 source, not {src_q.dtype}")
        window = self.window.for_input(src_q.shape[2:])
        out_shape = window.output_shape(src_q.shape[2:])
        out_per_group = self.groups[0].columns if self.groups else 0
        result = np.zeros((src_q.shape[0],) + tuple(out_shape) + (self.out_channels,), np.int32)
        if not self.count:
            return np.moveaxis(result, -1, 1)
        source = window.padded(np.moveaxis(src_q, 1, -1), np.uint8(src_zero_point), channels_last=True)
        taps = [index[1:] for index in window.tap_slices(out_shape)]  # spatial slices (after the Ellipsis)
        c = self.in_channels
        for g, pairs in enumerate(self.groups):
            if not pairs.count:
                continue
            block = result[..., g * out_per_group:(g + 1) * out_per_group].reshape(-1, out_per_group)
            group_peaks = None if peaks is None else peaks[g * out_per_group:(g + 1) * out_per_group]  # a view
            channels = source[..., g * c:(g + 1) * c]
            if c % 2:  # pairs span kernel positions: gather the im2col columns they read
                self._gathered(block, pairs, channels, taps, group_peaks)
            else:
                self._strided(block, pairs, channels, taps, group_peaks)
            result[..., g * out_per_group:(g + 1) * out_per_group] = block.reshape(result.shape[:-1] + (-1,))
        return np.moveaxis(result, -1, 1)

    def _strided(self, block: np.ndarray, pairs: PairSaturation, channels: np.ndarray, taps: list, peaks) -> None:
        """An even channel count: a pair is channels (2i, 2i + 1) at one kernel position, so each
        position's screen reads the sums of neighbouring channels through a strided view: no im2col."""
        c = self.in_channels
        screen = pairs.screen(pairs.first)
        tap_of, pair_of = np.divmod(screen.firsts, c)
        pair_of //= 2
        neighbours = np.add(channels[..., 0::2], channels[..., 1::2], dtype=np.int16)
        # The largest a0 + a1 of any channel pair at each input position, once: a kernel position's
        # screen then looks closer only at the few outputs where it passes the smallest bound there.
        loudest = neighbours.max(axis=-1)
        for tap in np.unique(tap_of):
            at = np.flatnonzero(tap_of == tap)  # the screen's groups at this kernel position
            near = np.nonzero(loudest[(slice(None),) + taps[tap]] > screen.bound[at].min())  # ([N], *out)
            if not near[0].size:
                continue
            view = neighbours[(slice(None),) + taps[tap]][near]  # [outputs near, C/2]
            position, which = np.nonzero(view[:, pair_of[at]] > screen.bound[at])
            found = tuple(index[position] for index in near)
            row = np.ravel_multi_index(found, loudest[(slice(None),) + taps[tap]].shape)
            group = at[which]
            values = channels[(slice(None),) + taps[tap]]  # [N, *out, C]
            a0 = values[found + (2 * pair_of[group],)]
            a1 = values[found + (2 * pair_of[group] + 1,)]
            pairs.accumulate(block, screen, row, group, a0, a1, peaks)

    def _gathered(self, block: np.ndarray, pairs: PairSaturation, channels: np.ndarray, taps: list, peaks) -> None:
        """An odd channel count (a first layer's 1 or 3): the im2col columns the risky pairs read, gathered
        a kernel position at a time (k = tap·C + c); k and k + 1 of every pair are among them, so in the
        compact array too a pair is adjacent."""
        needed = np.unique(np.concatenate([pairs.first, pairs.first + 1]))
        gathered = np.zeros((block.shape[0], len(needed)), np.uint8)
        inside = needed < pairs.reduction  # beyond: MLAS's zero padding of an odd K
        tap_of, channel_of = np.divmod(needed, self.in_channels)
        for tap in np.unique(tap_of[inside]):
            at = np.flatnonzero(inside & (tap_of == tap))
            gathered[:, at] = channels[(slice(None),) + taps[tap] + (channel_of[at],)].reshape(-1, len(at))
        block += pairs.corrections_at(gathered, np.searchsorted(needed, pairs.first), peaks)


def saturating_conv(src_q: np.ndarray, src_zero_point: int, weights: np.ndarray, groups: int = 1, strides=None,
                    dilations=None, pads=None) -> np.ndarray:
    """Σ (q_src − zp_src)·w over each window as MLAS's u8 × s8 AVX2 kernel computes it: int64 [N, OC, *out]."""
    from lpt.kernels.conv import conv_accumulate, pack_conv

    packed = pack_conv(weights, 0, int(src_zero_point), groups, strides, dilations, pads, int8_gemm=False)
    exact = conv_accumulate(src_q, packed).astype(np.int64)
    return exact + ConvPairSaturation.of(weights, groups, strides, dilations, pads).corrections(src_q, src_zero_point)
