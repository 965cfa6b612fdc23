# call 5: AUGURY_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider -x tests/layers/test_triton_gemv_w4m.py tests/layers/test_triton_gemv.py -k 'not fresh_process'
