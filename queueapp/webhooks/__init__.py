"""Signed webhook callbacks (Standard Webhooks) on job completion."""
