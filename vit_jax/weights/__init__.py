"""Weights from elsewhere and trained runs loaded for inference."""
