# Host warnings are errors for our own targets (dsi_target_warnings).
function(dsi_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
endfunction()
