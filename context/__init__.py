"""The context engine: keeps each session inside the model's window. Pure: no I/O."""
