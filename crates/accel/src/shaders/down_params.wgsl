// The down shaders' shape (`HotFfn::submit` writes it): down_nm.wgsl and down_sum.wgsl.
struct DownParams {
    n_hot: u32,      // neurons (rows of W, values per token in A)
    n_embd: u32,     // outputs per token
    row_bytes: u32,  // bytes per row of W
    slices: u32,     // neuron ranges (workgroups along y of down_nm)
    tokens: u32,
}
