//! Synthetic unit vectors with the shape of sentence embeddings, for the index's tests and
//! benchmark (no model needed): many near neighbours within a topic, few across.

use super::kmeans::splitmix64;

/// `n` unit vectors of `dim` with the shape sentence embeddings have: a low intrinsic dimension
/// (a `latent`-d point, drawn around one of `topics` centres, mapped into `dim` by a fixed
/// random matrix) plus a little isotropic noise. The map and the centres depend on `world` only,
/// so vectors and queries drawn with other seeds share them.
pub fn topic_vectors(n: usize, dim: usize, world: u64, seed: u64) -> Vec<f32> {
    const LATENT: usize = 24;
    const TOPICS: usize = 40;
    fn gauss(state: &mut u64) -> f32 {
        // Sum of four uniforms: close enough to normal for test data (variance 1/3).
        (0..4)
            .map(|_| (splitmix64(state) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .sum::<f32>()
    }
    let mut w = world;
    let map: Vec<f32> = (0..LATENT * dim).map(|_| gauss(&mut w)).collect();
    let centres: Vec<f32> = (0..TOPICS * LATENT).map(|_| gauss(&mut w)).collect();
    let mut state = seed;
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let t = (splitmix64(&mut state) % TOPICS as u64) as usize;
        let z: Vec<f32> = (0..LATENT)
            .map(|l| centres[t * LATENT + l] + 0.7 * gauss(&mut state))
            .collect();
        let v: Vec<f32> = (0..dim)
            .map(|d| {
                let mapped: f32 = (0..LATENT).map(|l| z[l] * map[l * dim + d]).sum();
                mapped + 0.3 * gauss(&mut state)
            })
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        out.extend(v.iter().map(|x| x / norm));
    }
    out
}
