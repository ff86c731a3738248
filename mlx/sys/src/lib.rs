//! Raw bindings to MLX.
