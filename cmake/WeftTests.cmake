# weft_slow_tests(TARGET LABEL): every test gtest_discover_tests found in TARGET gets the
# labels "LABEL;slow" (docs/testing.md: `ctest -LE slow` leaves out the tests that wait
# on time for seconds each). gtest_discover_tests takes one value per property (a list
# of labels does not survive its post-build step), so the labels are set by a file ctest
# reads after the discovered tests (TEST_INCLUDE_FILES), from the test list the
# discovery leaves in TARGET_TESTS.
function(weft_slow_tests target label)
  set(file ${CMAKE_CURRENT_BINARY_DIR}/${target}_slow_labels.cmake)
  file(WRITE ${file}
       "foreach(t IN LISTS ${target}_TESTS)\n"
       "  set_tests_properties(\${t} PROPERTIES LABELS \"${label};slow\")\n"
       "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${file})
endfunction()
