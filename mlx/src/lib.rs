//! Safe arrays and operations over MLX.
