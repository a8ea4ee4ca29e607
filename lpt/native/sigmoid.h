// lpt's float32 Sigmoid, the sequence of float32 operations lpt/numerics/sigmoid.py spells out and
// explains (it is lpt's NumPy kernels' Sigmoid). Built with -ffp-contract=off, each line below is the
// same rounded operation as there; s16.cpp has the eight-lane form, built from these constants.
#pragma once

namespace lpt_sigmoid {

constexpr float LOW = -86.0f, HIGH = 87.0f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float ROUND = 12582912.0f;  // 1.5·2^23
constexpr float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float P0 = 1.9875691500e-4f, P1 = 1.3981999507e-3f, P2 = 8.3334519073e-3f, P3 = 4.1665795894e-2f,
                P4 = 1.6666665459e-1f, P5 = 5.0000001201e-1f;

inline float sigmoid(float x) {
    if (x != x) return x;
    float t = -x;
    t = t >= LOW ? t : LOW;
    t = t <= HIGH ? t : HIGH;
    const float n = (t * LOG2E + ROUND) - ROUND;
    const float r = (t - n * LN2_HI) - n * LN2_LO;
    float p = P0;
    p = p * r + P1;
    p = p * r + P2;
    p = p * r + P3;
    p = p * r + P4;
    p = p * r + P5;
    const int bits = ((int)n + 127) << 23;
    float two_to_n;
    __builtin_memcpy(&two_to_n, &bits, sizeof two_to_n);
    const float e = ((p * (r * r) + r) + 1.0f) * two_to_n;
    return 1.0f / (1.0f + e);
}

}  // namespace lpt_sigmoid
