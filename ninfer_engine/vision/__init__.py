"""Media input for the Qwen3.5 family: the vision tower (`encoder`), the preprocessor of the
artifact's resources (`preprocess`), placeholder expansion and multimodal rotary positions
(`prompt`), and the tower as the engine loads it (`tower`)."""
