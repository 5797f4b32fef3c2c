#!/bin/bash
# The official image's convention: `bash ...` and `python ...` run as given, anything else is `airflow ...`.
case "${1:-}" in
  bash|python|python3|airflow) exec "$@" ;;
  "") exec airflow --help ;;
  *) exec airflow "$@" ;;
esac
