"""The local development stack: broker, model, workers and gateway on one machine; the demo."""
