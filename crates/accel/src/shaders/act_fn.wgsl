// The gated feed-forward's activation of a gate value: kind 0 SiLU, 1 GELU (tanh form). Shared
// by act.wgsl and the products that read act(gate) · up from the gate and up product's rows
// (products.wgsl's `x_act`), so both compute the same values.

fn act_of(g: f32, kind: u32) -> f32 {
    if (kind == 0u) {
        return g / (1.0 + exp(-g));
    }
    return 0.5 * g * (1.0 + tanh(0.7978845608028654 * g * (1.0 + 0.044715 * g * g)));
}
