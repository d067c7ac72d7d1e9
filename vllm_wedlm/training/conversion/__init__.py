"""Bringing real pretrained models in: conversion to WeDLM, its sources and tokenizers, provenance, SmolLM2."""
